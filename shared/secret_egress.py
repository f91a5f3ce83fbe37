"""A secret bound to hosts: the egress proxy adds it to a task's HTTPS requests to those hosts,
and the sandbox never holds it (issue 27).

A tenant binds a secret when it writes it (`PUT /v1/secrets/{name}` with `egress`): the binding
is sealed with the value (shared/secrets_cipher.py), so it changes only by writing the value
again, and whoever may post tasks cannot point a secret they cannot read at a host of theirs.

A bound secret is never exported into a command's environment (services/runtime/task_secrets.py);
the proxy (services/egress/secret_headers.py) reads it from the store by task, and puts
`header: format.format(value)` into each request inside a TLS tunnel to one of `hosts`, a
tunnel it ends itself with the deployment's CA, which the sandbox trusts. Every other host is
tunnelled untouched, and a plain-HTTP request never gets a secret (it would cross the network
in clear).
"""

from __future__ import annotations

import ipaddress
import re
from functools import cached_property
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from shared.address_policy import canonical_host

from .egress_policy import EgressRule, parse_rule

__all__ = ["MAX_SECRET_HOSTS", "SecretEgress", "bad_bound_value"]

MAX_SECRET_HOSTS = 32
# An HTTP field name (RFC 9110 token).
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}$")
# Headers that say where a request goes or how it is framed: a secret may not set them.
_FRAMING = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "expect",
        "proxy-authorization",
        "proxy-connection",
    }
)


def _host_rule(text: str) -> str:
    rule = parse_rule(text)
    if rule.anything:
        raise ValueError(f"{text!r}: a secret is bound to named hosts, not to `*`")
    if rule.network is not None and rule.network.num_addresses != 1:
        raise ValueError(f"{text!r}: a secret is bound to hosts or addresses, not a network")
    return rule.text()


HostRule = Annotated[str, Field(min_length=1, max_length=300), AfterValidator(_host_rule)]


class SecretEgress(BaseModel):
    """Where the proxy adds a secret, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hosts: tuple[HostRule, ...] = Field(
        min_length=1,
        max_length=MAX_SECRET_HOSTS,
        description="The hosts the secret is added for: `host`, `*.domain` or an IP address, "
        "each with an optional `:port`.",
    )
    header: str = Field(
        default="Authorization", description="The request header the proxy sets to it."
    )
    format: str = Field(
        default="{}",
        max_length=200,
        description="The header's value, `{}` standing for the secret (e.g. `Bearer {}`).",
    )

    @field_validator("header")
    @classmethod
    def _header_name(cls, header: str) -> str:
        if not _TOKEN.match(header):
            raise ValueError(f"{header!r} is not an HTTP header name")
        if header.lower() in _FRAMING:
            raise ValueError(f"{header!r} says where a request goes or how it is framed")
        return header

    @field_validator("format")
    @classmethod
    def _one_placeholder(cls, text: str) -> str:
        rest = text.replace("{}", "", 1)
        if "{}" not in text or "{" in rest or "}" in rest:
            raise ValueError(
                "the format holds `{}` once (where the secret goes) and no other brace"
            )
        if any(ch in text for ch in "\r\n\0"):
            raise ValueError("the format holds no line break or NUL")
        return text

    @cached_property
    def _rules(self) -> tuple[EgressRule, ...]:
        return tuple(parse_rule(h) for h in self.hosts)

    def covers(self, host: str, port: int) -> bool:
        """Whether a request to `host`:`port` (as the tunnel named it) gets the secret."""
        host = canonical_host(host)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return any(r.network is None and r.allows_name(host, port) for r in self._rules)
        return any(r.network is not None and r.allows_address(address, port) for r in self._rules)

    def header_value(self, value: str) -> str:
        return self.format.replace("{}", value)


def bad_bound_value(value: str) -> str | None:
    """Why `value` cannot go into a header (None if it can): no line break, NUL or other
    control character, which would end the header and start another."""
    if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
        return "a secret bound to hosts goes into a header: it may hold no control character"
    return None
