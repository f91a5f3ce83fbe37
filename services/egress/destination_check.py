"""Whether a task's policy lets a connection go to host:port, and to which address.

A host written as an address must be one the policy allows. A name must be one the policy
allows as written; it is then resolved here, once, and every address it has is checked: one
that is not public unicast (loopback, private, link-local, the metadata address...) only if the
task's policy names it with an address rule (shared/egress_policy.py). The connection then goes
to the address checked (pinned), so a name that resolves elsewhere a moment later changes
nothing.
"""

from __future__ import annotations

import asyncio
from ipaddress import ip_address

from shared.address_policy import (
    LookupFailed,
    Resolver,
    address_refused,
    canonical_host,
    literal_address,
    system_resolver,
)
from shared.egress_policy import EgressPolicy

from .errors import Refused

__all__ = ["checked_destination"]


def _outside(policy: EgressPolicy, host: str, port: int) -> Refused:
    allowed = ", ".join(policy.allow) or "nothing"
    return Refused(
        "not_allowed",
        f"{host}:{port} is not in this task's network policy (it allows: {allowed}); ask for "
        "it to be added instead of retrying",
    )


def _private(policy: EgressPolicy, host: str, port: int, why: str) -> Refused:
    return Refused(
        "private_address",
        f"{host}:{port} refused: {why}, which only a policy naming that address allows",
    )


async def checked_destination(
    policy: EgressPolicy,
    host: str,
    port: int,
    timeout_s: float,
    resolver: Resolver = system_resolver,
) -> str:
    """The address to connect to for host:port; Refused (with the agent's message) if none."""
    name = canonical_host(host)
    try:
        literal = literal_address(name)
    except ValueError as exc:
        raise Refused("bad_host", f"{host!r}: {exc}") from None
    if literal is not None:
        if not policy.allows_address(literal, port):
            raise _outside(policy, name, port)
        why = address_refused(literal)
        if why is not None and not policy.names_private(literal, port):
            raise _private(policy, name, port, why)
        return str(literal)
    if not policy.allows_name(name, port):
        raise _outside(policy, name, port)
    try:
        addresses = await asyncio.wait_for(resolver(name, port), timeout_s)
    except (OSError, UnicodeError, LookupFailed, TimeoutError) as exc:
        raise Refused("lookup_failed", f"{name} did not resolve: {exc or 'timed out'}") from None
    if not addresses:
        raise Refused("lookup_failed", f"{name} has no address")
    for text in addresses:
        text = text.split("%", 1)[0]
        why = address_refused(text)
        if why is not None and not policy.names_private(ip_address(text), port):
            raise _private(policy, name, port, f"{name} resolves to {why}")
    return addresses[0].split("%", 1)[0]
