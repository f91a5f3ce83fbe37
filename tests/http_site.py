"""A static HTTP site for tests of the egress proxy: the files of a folder, on an address of
this machine the sandboxes' NO_PROXY does not name (127.0.0.2), so their fetches go through the
proxy (tests/integration/runtime/test_runtime_egress.py, tests/security/test_egress.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["OUTSIDE", "STALLED", "STALLED_SENT", "STALLED_SIZE", "resumed", "serving"]

OUTSIDE = "127.0.0.2"
# A body the host stops sending part of the way (a slow or hostile host): STALLED_SENT of its
# STALLED_SIZE bytes at once, the rest only once `resumed` is set (or never: 60 s, then the
# connection is closed).
STALLED = "/stalled.bin"
STALLED_SIZE = 6 << 20
STALLED_SENT = 2 << 20
resumed = threading.Event()


class _Files(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: several responses on one connection

    def do_GET(self) -> None:
        if self.path != STALLED:
            super().do_GET()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(STALLED_SIZE))
        self.end_headers()
        try:
            self.wfile.write(b"s" * STALLED_SENT)
            self.wfile.flush()
            if resumed.wait(60):
                self.wfile.write(b"s" * (STALLED_SIZE - STALLED_SENT))
        except ConnectionError:
            pass  # the proxy cut it: what a test of a stalled host expects
        self.close_connection = True

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(root: Path, publish: Callable[[str], None] | None = None) -> Iterator[str]:
    """Serve `root` on OUTSIDE; yields its `host:port`. `publish(address)` writes the files
    that must name the address before the first request."""
    server = http.server.ThreadingHTTPServer(
        (OUTSIDE, 0), lambda *a: _Files(*a, directory=str(root))
    )
    address = f"{OUTSIDE}:{server.server_address[1]}"
    if publish is not None:
        publish(address)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield address
    finally:
        server.shutdown()
