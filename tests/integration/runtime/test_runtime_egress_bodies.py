"""Long bodies through a real egress proxy the way a sandbox reaches it (its unix socket), from a
real HTTP server on loopback: the part moved inside the kernel (body_splice.py) arrives byte for
byte and in order, and a side that hangs up mid-body, or a tenant's allowance used up mid-body,
ends that connection only.

These talk to the proxy's socket directly, as the sandbox's relay would, so each case takes
a fraction of a second; tests/integration/runtime/test_runtime_egress.py has the same bodies
from inside a sandbox."""

from __future__ import annotations

import hashlib
import http.server
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from egress_proxies import Proxies  # type: ignore[import-not-found]

from shared.egress_policy import SANDBOX_EGRESS_FILE
from shared.egress_usage import ALLOWANCES_KEY

MIB = 1024 * 1024
_BIG = random.Random(29).randbytes(12 * MIB + 17)
_SMALL = b"a small body between two big ones"
_SPLICED = "deckhands_egress_body_spliced_bytes_total"


_RESUME = threading.Event()  # a stalled body goes on


class _Site(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # kept alive

    def do_GET(self) -> None:
        body = {"/big": _BIG, "/small": _SMALL, "/short": _BIG, "/stall": _BIG}[self.path]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in ("/short", "/stall"):  # a third, then hangs up or waits
            self.wfile.write(body[: len(body) // 3])
            self.wfile.flush()
            if self.path == "/short" or not _RESUME.wait(20):
                self.close_connection = True
                return
            body = body[len(body) // 3 :]
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Proxies]:
    folder = Path(tmp_path_factory.mktemp("egress"))
    logs = Path(tmp_path_factory.mktemp("egress-logs"))
    env = {
        "DECKHANDS_REDIS_URL": redis_url,
        "DECKHANDS_EGRESS_SCAN_INTERVAL_S": "0.1",
        "DECKHANDS_EGRESS_ACTIVITY_INTERVAL_S": "0.2",
    }
    running = Proxies(folder, logs, "", env)
    running.start("egress-0")
    yield running
    running.kill("egress-0")


def _policy(folder: Path, allow: list[str], tenant: str | None = None) -> None:
    policy = {"task_id": folder.name, "tenant_id": tenant, "network": {"allow": allow}}
    (folder / SANDBOX_EGRESS_FILE).write_text(json.dumps(policy))


def _sandbox(proxy: Proxies, site: str, tenant: str | None = None) -> Path:
    """A sandbox's folder with its policy, once the proxy listens on it: the socket's path."""
    folder = proxy.folder / uuid.uuid4().hex[:12]
    folder.mkdir()
    _policy(folder, [site], tenant)
    path = folder / "egress-0.sock"
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the proxy never listened for the sandbox"
        time.sleep(0.05)
    return path


def _connect(path: Path) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX)
    conn.settimeout(20)
    conn.connect(str(path))
    return conn


def _get(conn: socket.socket, site: str, name: str, stop_after: int = -1) -> tuple[int, bytes]:
    """(the status, the body as far as it came); `stop_after`: read no more than that."""
    conn.sendall(f"GET http://{site}/{name} HTTP/1.1\r\nHost: {site}\r\n\r\n".encode())
    got = b""
    while b"\r\n\r\n" not in got:
        piece = conn.recv(65536)
        assert piece, got
        got += piece
    head, body = got.split(b"\r\n\r\n", 1)
    status = int(head.split()[1])
    length = next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))
    size = int(length[15:])
    pieces = [body]
    received = len(body)
    while received < size and (stop_after < 0 or received < stop_after):
        try:
            piece = conn.recv(MIB)
        except ConnectionResetError:
            piece = b""
        if not piece:
            break  # the proxy hung up before the body's end
        pieces.append(piece)
        received += len(piece)
    return status, b"".join(pieces)


def test_long_bodies_arrive_whole_and_in_order_on_one_connection(proxy: Proxies, site: str) -> None:
    spliced = proxy.counted(_SPLICED)
    with _connect(_sandbox(proxy, site)) as conn:
        for name, want in (("big", _BIG), ("small", _SMALL), ("big", _BIG), ("big", _BIG)):
            status, body = _get(conn, site, name)
            assert status == 200
            assert len(body) == len(want) and hashlib.sha256(body).digest() == (
                hashlib.sha256(want).digest()
            ), name
    # Most of each big body went inside the kernel: all but its first piece and last byte.
    spliced = proxy.counted(_SPLICED) - spliced
    assert 3 * (len(_BIG) - 2 * MIB) < spliced < 3 * len(_BIG), spliced


def test_a_sandbox_that_hangs_up_mid_body_leaves_the_proxy_serving(
    proxy: Proxies, site: str
) -> None:
    path = _sandbox(proxy, site)
    for _ in range(3):
        with _connect(path) as conn:
            status, body = _get(conn, site, "big", stop_after=3 * MIB)
            assert status == 200 and 3 * MIB <= len(body) < len(_BIG)
    with _connect(path) as conn:
        status, body = _get(conn, site, "big")
        assert status == 200 and body == _BIG


def test_a_host_that_hangs_up_mid_body_ends_the_sandboxs_connection(
    proxy: Proxies, site: str
) -> None:
    path = _sandbox(proxy, site)
    started = time.monotonic()
    with _connect(path) as conn:
        status, body = _get(conn, site, "short")
        assert status == 200 and body == _BIG[: len(body)]
        assert len(body) < len(_BIG)  # the end came early, and did not hang
    assert time.monotonic() - started < 15
    with _connect(path) as conn:
        assert _get(conn, site, "big") == (200, _BIG)


def test_an_allowance_used_up_mid_body_cuts_that_download(
    proxy: Proxies, site: str, redis_url: str
) -> None:
    tenant = f"capped-{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    client.hset(ALLOWANCES_KEY, tenant, str(4 * MIB))
    try:
        path = _sandbox(proxy, site, tenant)
        time.sleep(1.0)  # the proxy reads allowances back with its next count (0.2 s here)
        spliced = proxy.counted(_SPLICED)
        with _connect(path) as conn:
            status, body = _get(conn, site, "big")
        assert status == 200 and 4 * MIB <= len(body) < 4 * MIB + 2 * MIB, len(body)
        assert body == _BIG[: len(body)]
        assert proxy.counted(_SPLICED) > spliced  # cut while inside the kernel
    finally:
        client.hdel(ALLOWANCES_KEY, tenant)
        client.close()


def test_a_narrowed_policy_ends_a_download_at_once_while_its_host_is_silent(
    proxy: Proxies, site: str
) -> None:
    """The download's host went quiet with most of the body to come (the proxy waits on it
    inside the kernel); the policy then stops allowing the host: the sandbox sees its
    connection end now, not when the host next sends."""
    path = _sandbox(proxy, site)
    _RESUME.clear()
    spliced = proxy.counted(_SPLICED)
    try:
        with _connect(path) as conn:
            status, body = _get(conn, site, "stall", stop_after=len(_BIG) // 3)
            assert status == 200 and len(body) == len(_BIG) // 3
            assert proxy.counted(_SPLICED) > spliced  # moving it, and now waiting on the host
            _policy(path.parent, [])  # e.g. its action ended, and nothing runs between actions
            started = time.monotonic()
            conn.settimeout(10)
            try:
                more = conn.recv(MIB)
            except ConnectionResetError:
                more = b""
            assert more == b"", len(more)
            assert time.monotonic() - started < 3
    finally:
        _RESUME.set()
