"""Only the Host names the operator lists are answered (DECKHANDS_TRUSTED_HOSTS).

A web page the user visits cannot send the gateway an API key (no cookie carries one, and a
cross-origin request with an Authorization header needs a CORS preflight the gateway never
grants), but through DNS rebinding its requests reach a local gateway under the attacker's host
name. Refusing unknown hosts closes that door. The probes and /metrics answer any host: the
kubelet asks by the pod's address, and they carry nothing a page could use.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["TrustedHostMiddleware", "host_is_trusted"]

_ANY_HOST_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _host_of(header: str) -> str:
    """The host of a Host header, without its port (an IPv6 address keeps no brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def host_is_trusted(header: str | None, trusted: Sequence[str]) -> bool:
    if header is None or not header.strip():
        return False
    host = _host_of(header)
    for pattern in trusted:
        pattern = pattern.lower()
        if pattern == "*" or host == pattern:
            return True
        if pattern.startswith("*.") and host.endswith(pattern[1:]):
            return True
    return False


class TrustedHostMiddleware:
    def __init__(self, app: ASGIApp, trusted_hosts: Sequence[str]) -> None:
        self.app = app
        self.trusted = [h.strip("[]") for h in trusted_hosts]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in _ANY_HOST_PATHS:
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host")
        if host_is_trusted(host, self.trusted):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "detail": f"host {host!r} is not one this gateway answers; the operator lists "
                "them in DECKHANDS_TRUSTED_HOSTS"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 400,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
