"""Which sandbox each connection into mitmproxy comes from.

mitmproxy listens on loopback only, and only this process's relays (sockets.py) connect to
it: each relay registers the local port of its upstream connection before it sends a byte,
so a hook reads the sandbox from the connection's peer port. Nothing the sandbox sends (a
header, a host name) says who it is; a connection with no registered port is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.egress_policy import SandboxEgress
from shared.secrets_store import StoredSecret

__all__ = ["Link", "Links"]


@dataclass
class Link:
    """One sandbox connection through the proxy, and the addresses its hosts were pinned to."""

    sandbox: SandboxEgress
    folder: str
    # (host, port) as the sandbox asked → the checked address mitmproxy must connect to.
    pinned: dict[tuple[str, int], str] = field(default_factory=dict)
    # The CONNECT target of a tunnel, to hold a TLS ClientHello's SNI against.
    tunnel: tuple[str, int] | None = None
    # Each destination asked for, in order: (host, port, allowed, why refused).
    destinations: list[tuple[str, int, bool, str]] = field(default_factory=list)
    refused: str | None = None
    # The task's secrets bound to the tunnel's host; `secrets_ok` once its ClientHello named
    # that host (or none) and the proxy ended the TLS itself, so they may be added.
    bound: list[StoredSecret] = field(default_factory=list)
    secrets_ok: bool = False
    secrets_added: set[str] = field(default_factory=set)

    @property
    def reached(self) -> list[tuple[str, int]]:
        """The destinations it was allowed to (host as the sandbox named it, port)."""
        return [(host, port) for host, port, allowed, _ in self.destinations if allowed]

    @property
    def hosts(self) -> list[str]:
        return [f"{host}:{port}" for host, port, allowed, _ in self.destinations if allowed]

    @property
    def tenant(self) -> str:
        return self.sandbox.tenant_id or "-"


class Links:
    def __init__(self) -> None:
        self._by_port: dict[int, Link] = {}

    def add(self, local_port: int, link: Link) -> None:
        self._by_port[local_port] = link

    def remove(self, local_port: int) -> None:
        self._by_port.pop(local_port, None)

    def of(self, peername: tuple[str, int] | None) -> Link | None:
        if not peername or peername[0] not in ("127.0.0.1", "::1"):
            return None
        return self._by_port.get(int(peername[1]))

    def __len__(self) -> int:
        return len(self._by_port)
