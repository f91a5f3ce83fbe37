"""A static HTTP site for tests of the egress proxy: the files of a folder, on an address of
this machine the sandboxes' NO_PROXY does not name (127.0.0.2), so their fetches go through the
proxy (tests/integration/runtime/test_runtime_egress.py, tests/security/test_egress.py)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["OUTSIDE", "serving"]

OUTSIDE = "127.0.0.2"


class _Files(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: several responses on one connection

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
