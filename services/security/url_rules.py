"""The egress rule of a URL a command or a cell names: `host:port`, the scheme's port by
default (network_scope.py, cell_scope.py)."""

from __future__ import annotations

from urllib.parse import urlsplit

from shared.egress_policy import normal_rule

__all__ = ["host_rule"]


def host_rule(url: str) -> str | None:
    """`host:port` of a URL (scheme's default port), or None if it names no host."""
    url = url.removeprefix("git+")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    try:
        return normal_rule(f"{host}:{port}")
    except ValueError:
        return None
