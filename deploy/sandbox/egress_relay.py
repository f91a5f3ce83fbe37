"""The sandbox's end of the egress proxy: 127.0.0.1:3128 relayed to the proxy's sockets.

A sandbox whose task has a network policy has no network, only loopback and the folder the
runtime mounts at /run/deckhands/egress, holding one unix socket per egress proxy replica.
HTTP_PROXY and HTTPS_PROXY name 127.0.0.1:3128, which pip, npm, git and curl honour; this
relay carries each connection to a replica's socket, trying the next when one does not
answer (a replica killed: the next connection goes through another).

Started by holder.py as the channel's uid (999), so the agent (uid 1000) can neither stop nor
replace it. Standard library only.
"""

from __future__ import annotations

import _thread
import os
import socket

__all__ = ["serve"]

FOLDER = "/run/deckhands/egress"
PORT = 3128
_CHUNK = 262144


def _sockets(folder: str) -> list[str]:
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".sock"))
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names]


def _upstream(folder: str, first: int) -> socket.socket | None:
    paths = _sockets(folder)
    for i in range(len(paths)):
        path = paths[(first + i) % len(paths)]
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            up.connect(path)
            return up
        except OSError:
            up.close()
    return None


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(_CHUNK):
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


_UNAVAILABLE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    b"Content-Length: 43\r\n\r\ndeckhands egress proxy: no replica answers\n"
)


def _serve_one(client: socket.socket, folder: str, first: int) -> None:
    up = _upstream(folder, first)
    if up is None:
        try:
            client.sendall(_UNAVAILABLE)
        finally:
            client.close()
        return
    done = _thread.allocate_lock()
    done.acquire()

    def back() -> None:
        _copy(up, client)
        done.release()

    _thread.start_new_thread(back, ())
    _copy(client, up)
    done.acquire()
    client.close()
    up.close()


def serve(folder: str = FOLDER, host: str = "127.0.0.1", port: int = PORT) -> None:
    """Accept forever (in the calling thread); spread connections over the replicas."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(256)
    count = 0
    while True:
        client, _ = listener.accept()
        count += 1
        _thread.start_new_thread(_serve_one, (client, folder, count))


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    serve(args[0] if args else FOLDER, port=int(args[1]) if len(args) > 1 else PORT)
