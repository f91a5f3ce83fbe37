"""Where a task's sandbox may connect through the egress proxy (issue 27): a task's policy, the
operator's bound on it, and the check the proxy makes for each connection.

A policy is a list of rules, each a destination with an optional port:

- `pypi.org`: that host name exactly; `*.github.com`: any name under github.com (not the apex);
- `203.0.113.7`, `10.20.0.0/16`, `2001:db8::/32`: an address or a network (CIDR);
- `*`: any host name and any public address (an operator's bound, "the whole internet");
- `:443` after any of them (`[2001:db8::1]:443` for an IPv6 address): that port only.

A name is judged as written first (a rule must allow it), then by what it resolves to: every
address that is not public unicast (`address_policy.address_refused`: loopback, private,
link-local, the metadata addresses...) is refused unless the operator's bound names it with an
address rule of its own, one that lies wholly in such a range (`10.20.0.0/16`; `*` or
`0.0.0.0/0` do not count). So a tenant's name that resolves to 127.0.0.1 or 169.254.169.254
reaches nothing, and the operator can still grant a company's internal package index by address.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from functools import cached_property
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from shared.address_policy import (
    address_refused,
    canonical_host,
    network_public,
    network_refused,
)

__all__ = [
    "SANDBOX_EGRESS_FILE",
    "SANDBOX_EGRESS_MOUNT",
    "SANDBOX_PROXY_PORT",
    "EgressPolicy",
    "EgressRule",
    "RuleText",
    "SandboxEgress",
    "normal_rule",
    "parse_rule",
    "policy_outside",
    "rules_within",
]

IPNetwork = IPv4Network | IPv6Network
IPAddress = IPv4Address | IPv6Address

_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
# An IPv6 address or network in brackets, so that a port may follow it (`[2001:db8::/32]:443`).
_BRACKETED = re.compile(r"^\[([0-9a-f:./]+)\](?::(\d{1,5}))?$")
MAX_RULES = 64


@dataclass(frozen=True)
class EgressRule:
    """One destination: a name (`wildcard`: any name under it), a network, or anything public."""

    name: str | None = None
    wildcard: bool = False
    network: IPNetwork | None = None
    port: int | None = None

    @property
    def anything(self) -> bool:
        return self.name is None and self.network is None

    def text(self) -> str:
        if self.anything:
            dest = "*"
        elif self.network is not None:
            net = self.network
            dest = str(net.network_address) if _single(net) else str(net)
            if self.port is not None and net.version == 6:
                dest = f"[{dest}]"
        else:
            dest = f"*.{self.name}" if self.wildcard else str(self.name)
        return dest if self.port is None else f"{dest}:{self.port}"

    def port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port

    def allows_name(self, name: str, port: int) -> bool:
        """Whether this rule lets a connection to `name` (a host name, not an address) go on
        to its lookup."""
        if not self.port_ok(port) or self.network is not None:
            return False
        if self.anything:
            return True
        return name.endswith("." + str(self.name)) if self.wildcard else name == self.name

    def allows_address(self, address: IPAddress, port: int) -> bool:
        """Whether this rule allows an address written as such (a `*` only a public one)."""
        if not self.port_ok(port):
            return False
        if self.anything:
            return address_refused(address) is None
        return self.network is not None and address in self.network

    def names_private(self, address: IPAddress, port: int) -> bool:
        """Whether this (operator's) rule names a non-public address explicitly: a network
        wholly non-public (`10.20.0.0/16`), not one that merely holds some (`0.0.0.0/0`)."""
        net = self.network
        return net is not None and self.port_ok(port) and address in net and network_refused(net)

    def within(self, bound: EgressRule) -> bool:
        """Whether every destination this rule allows, `bound` allows too."""
        if bound.port is not None and bound.port != self.port:
            return False
        if bound.anything:
            # Anything public: no network holding a non-public address, which only an address
            # rule of the operator's can grant.
            return self.network is None or network_public(self.network)
        if self.anything:
            return False
        if self.network is not None:
            return (
                bound.network is not None
                and self.network.version == bound.network.version
                and self.network.subnet_of(bound.network)  # type: ignore[arg-type]
            )
        if bound.name is None:
            return False
        name = str(self.name)
        if bound.wildcard:
            # `*.api.github.com` and `api.github.com` lie under `*.github.com`, and so does
            # `*.github.com` itself; the apex `github.com` does not.
            return name.endswith("." + bound.name) or (self.wildcard and name == bound.name)
        return not self.wildcard and name == bound.name


def _single(net: IPNetwork) -> bool:
    return net.num_addresses == 1


def _port(rule: str, text: str) -> int:
    port = int(text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{rule!r}: port {port} is out of range (1-65535)")
    return port


def parse_rule(text: str) -> EgressRule:
    """A rule as written; ValueError naming what is wrong."""
    raw = text.strip().lower()
    if not raw:
        raise ValueError("an empty rule")
    port: int | None = None
    bracketed = _BRACKETED.match(raw)
    if bracketed:
        host = bracketed.group(1)
        port = _port(text, bracketed.group(2)) if bracketed.group(2) else None
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
        if not port_text.isdigit():
            raise ValueError(f"{text!r}: the port must be a number")
        port = _port(text, port_text)
    else:
        host = raw
    if host == "*":
        return EgressRule(port=port)
    if "%" in host:  # ipaddress takes `fe80::1%eth0`, whose zone means nothing to the proxy
        raise ValueError(f"{text!r}: an address with a zone (`%`) is not a rule")
    try:
        network = ipaddress.ip_network(host, strict=False)
    except ValueError:
        network = None
    if bracketed and (network is None or network.version != 6):
        raise ValueError(f"{text!r}: only an IPv6 address or network goes in brackets")
    if network is not None:
        if "/" in host and network.network_address != ipaddress.ip_address(host.split("/")[0]):
            raise ValueError(f"{text!r}: write the network as {network} (no host bits)")
        return EgressRule(network=network, port=port)
    if "[" in host or "]" in host:
        raise ValueError(f"{text!r}: only an IPv6 address or network goes in brackets")
    wildcard = host.startswith("*.")
    name = canonical_host(host[2:] if wildcard else host)
    labels = name.split(".")
    if (
        not name
        or "*" in name
        or len(name) > 253
        or not all(_LABEL.match(label) for label in labels)
    ):
        raise ValueError(
            f"{text!r} is not a host name, `*.` and a domain, an IP address or a CIDR network"
        )
    if labels[-1].isdigit():
        raise ValueError(f"{text!r}: write an address in dotted decimal (or as a CIDR)")
    if wildcard and len(labels) < 2:
        raise ValueError(f"{text!r}: a wildcard must stand before a domain of two labels or more")
    return EgressRule(name=name, wildcard=wildcard, port=port)


def normal_rule(text: str) -> str:
    """A rule in its one written form (lowercase, networks canonical); ValueError if bad."""
    return parse_rule(text).text()


RuleText = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(normal_rule)]


class EgressPolicy(BaseModel):
    """Where a task's sandbox may connect, through the egress proxy only. Empty: nowhere."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow: tuple[RuleText, ...] = Field(
        default=(),
        max_length=MAX_RULES,
        description="Destinations: `host`, `*.domain`, an IP address, a CIDR network or `*` "
        "(any public host), each with an optional `:port`.",
    )

    between_actions: tuple[RuleText, ...] = Field(
        default=(),
        max_length=MAX_RULES,
        description="What a process the agent left running (a dev server, a watcher) may still "
        "reach once the action that started it ended, until the next action: rules within "
        "`allow`. Empty (the default): nothing between actions.",
    )

    @model_validator(mode="after")
    def _background_within_allow(self) -> EgressPolicy:
        if self.between_actions:
            outside = policy_outside(EgressPolicy(allow=self.between_actions), self)
            if outside is not None:
                raise ValueError(
                    f"between_actions: the rule {outside!r} is not within the task's `allow`"
                )
        return self

    def background(self) -> EgressPolicy:
        """The policy between actions."""
        return EgressPolicy(allow=self.between_actions)

    @cached_property
    def _parsed(self) -> tuple[EgressRule, ...]:
        # Parsed once per policy, not on each connection the proxy checks against it.
        return tuple(parse_rule(r) for r in self.allow)

    def rules(self) -> tuple[EgressRule, ...]:
        return self._parsed

    def allows_name(self, name: str, port: int) -> bool:
        name = canonical_host(name)
        return any(r.allows_name(name, port) for r in self.rules())

    def allows_address(self, address: IPAddress, port: int) -> bool:
        return any(r.allows_address(address, port) for r in self.rules())

    def names_private(self, address: IPAddress, port: int) -> bool:
        return any(r.names_private(address, port) for r in self.rules())

    def union(self, other: EgressPolicy) -> EgressPolicy:
        merged = dict.fromkeys(self.allow + other.allow)
        background = dict.fromkeys(self.between_actions + other.between_actions)
        return EgressPolicy(allow=tuple(merged), between_actions=tuple(background))


def rules_within(policy: EgressPolicy, bound: EgressPolicy) -> EgressPolicy:
    """The rules of `policy` that `bound` allows, in their order."""
    bounds = bound.rules()
    return EgressPolicy(
        allow=tuple(r.text() for r in policy.rules() if any(r.within(b) for b in bounds))
    )


def policy_outside(policy: EgressPolicy, bound: EgressPolicy) -> str | None:
    """The first rule of `policy` that `bound` does not allow, as written; None if within."""
    bounds = bound.rules()
    for rule in policy.rules():
        if not any(rule.within(b) for b in bounds):
            return rule.text()
    return None


# -- the contract between the runtime, a sandbox and the egress proxy

# Where a sandbox with a policy finds its folder (read-only): the proxy replicas' sockets.
SANDBOX_EGRESS_MOUNT = "/run/deckhands/egress"
# The address the sandbox's relay listens on; HTTP_PROXY and HTTPS_PROXY name it.
SANDBOX_PROXY_PORT = 3128
# The runtime's file in each sandbox's folder: whose sandbox it is and where it may connect.
SANDBOX_EGRESS_FILE = "policy.json"
# The deployment's egress CA certificate in each sandbox's folder, if it has one: the sandbox
# trusts it (deploy/sandbox/holder.py), so the proxy can add secrets bound to a host.
SANDBOX_EGRESS_CA = "ca.crt"
# The sandbox's root is read-only: the system's bundle with that CA added is written by the
# holder, as root, into a small tmpfs of root's, and tools are pointed at it.
SANDBOX_TRUST_DIR = "/run/deckhands/trust"
SANDBOX_CA_BUNDLE = f"{SANDBOX_TRUST_DIR}/ca-certificates.crt"


class SandboxEgress(BaseModel):
    """What the runtime tells the egress proxy of a sandbox it started (SANDBOX_EGRESS_FILE):
    the folder, not anything the sandbox sends, is how the proxy knows whose it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task_id: str
    tenant_id: str | None = None
    network: EgressPolicy
