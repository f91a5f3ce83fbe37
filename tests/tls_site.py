"""An HTTPS (or plain HTTP) test server on OUTSIDE (127.0.0.2) that records every request's
headers, for the secrets the egress proxy adds (tests/integration/runtime/
test_runtime_egress_secrets.py, tests/security/test_egress.py). Its certificate is signed by a
test CA of its own, which the proxy is told to trust upstream (DECKHANDS_EGRESS_UPSTREAM_CA_FILE)
and the sandbox is not.

    GET /echo       200, the Authorization header it got, in the body
    GET /redirect   302 to `redirect_to` (another host)
    anything else   200 "ok"
"""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from http_site import OUTSIDE  # type: ignore[import-not-found]

from tools.egress_ca import issue

__all__ = ["TlsSite", "tls_serving"]


@dataclass
class TlsSite:
    address: str
    # (path, {header name lowercased: value}) of each request, in order.
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    redirect_to: str = ""

    def headers_seen(self, name: str) -> list[str]:
        return [h[name.lower()] for _, h in self.requests if name.lower() in h]


def _handler(site: TlsSite) -> type[http.server.BaseHTTPRequestHandler]:
    class Recording(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            site.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", site.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = b"ok\n"
            if self.path.startswith("/echo"):
                body = f"seen: {self.headers.get('Authorization', '-')}\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Recording


@contextmanager
def tls_serving(ca_pem: bytes | None, workdir: Path, redirect_to: str = "") -> Iterator[TlsSite]:
    """An HTTPS server on OUTSIDE with a certificate for that address signed by `ca_pem` (key
    and certificate), or a plain HTTP one without; yields its TlsSite."""
    site = TlsSite(address="", redirect_to=redirect_to)
    server = http.server.ThreadingHTTPServer((OUTSIDE, 0), _handler(site))
    if ca_pem is not None:
        key, cert = issue(ca_pem, [OUTSIDE])
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "key.pem").write_bytes(key)
        (workdir / "cert.pem").write_bytes(cert)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(workdir / "cert.pem", workdir / "key.pem")
        server.socket = context.wrap_socket(server.socket, server_side=True)
    site.address = f"{OUTSIDE}:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield site
    finally:
        server.shutdown()
        server.server_close()
