"""A TCP listener for tests of outbound connections: it counts the connections it is offered
and answers each with a banner (what a NATS or Redis port would say first), so a test can
assert both that nothing connected and that nothing the listener said was quoted back."""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["Listener"]


class Listener:
    def __init__(self, host: str = "127.0.0.1", banner: bytes = b"") -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.banner = banner
        self.sock = socket.create_server((host, 0), family=family)
        self.sock.settimeout(0.2)
        self.port = int(self.sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            with conn, contextlib.suppress(OSError):
                conn.sendall(self.banner)
                conn.settimeout(1)
                conn.recv(4096)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
