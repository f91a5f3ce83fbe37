"""mitmproxy's TLS state for one replica: the deployment's CA, and what it trusts upstream.

Every replica signs with the same CA (DECKHANDS_EGRESS_CA_FILE), the one sandboxes trust, so
that a connection carries on through the other replica when one dies. mitmproxy reads it from
its confdir as `mitmproxy-ca.pem` (key, then certificate); each replica has a confdir of its
own, because mitmproxy writes more there and two replicas writing one would read each other's
half-written files. Without a CA file, mitmproxy makes a CA of its own that no sandbox trusts,
and no TLS is ended for a secret (handlers.py refuses such a tunnel, saying why).
"""

from __future__ import annotations

import os
from pathlib import Path

import certifi

from .settings import EgressSettings

__all__ = ["prepare_confdir"]

_CA_NAME = "mitmproxy-ca.pem"
_UPSTREAM_NAME = "upstream-ca.pem"


def _write(path: Path, data: bytes, mode: int) -> None:
    written = path.with_name(path.name + ".new")
    fd = os.open(written, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(written, path)


def prepare_confdir(settings: EgressSettings) -> tuple[str, str | None]:
    """(mitmproxy's confdir, the upstream CA bundle or None for the public ones only)."""
    confdir = Path(settings.dir) / ".mitmproxy" / settings.replica
    confdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if settings.ca_file:
        ca = Path(settings.ca_file).read_bytes()
        if b"PRIVATE KEY-----" not in ca or b"BEGIN CERTIFICATE-----" not in ca:
            raise ValueError(
                f"DECKHANDS_EGRESS_CA_FILE {settings.ca_file!r} must hold the CA's private key "
                "and its certificate, in PEM (python -m tools.egress_ca makes one)"
            )
        _write(confdir / _CA_NAME, ca, 0o600)
    upstream = None
    if settings.upstream_ca_file:
        # Added to the public roots, not instead of them.
        bundle = Path(certifi.where()).read_bytes() + b"\n"
        bundle += Path(settings.upstream_ca_file).read_bytes()
        _write(confdir / _UPSTREAM_NAME, bundle, 0o644)
        upstream = str(confdir / _UPSTREAM_NAME)
    return str(confdir), upstream
