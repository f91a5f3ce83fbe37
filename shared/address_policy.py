"""Which hosts a connection the system makes on a tenant's behalf may reach: a webhook's POST
(services/gateway/webhooks/sender.py) and a repository's fetch (services/runtime/checkout.py).

A tenant names the URL, so without a policy the gateway and the runtime would reach whatever
their own network reaches: NATS, Redis, the gateway itself on loopback, the operator's private
network, a cloud's metadata service. The policy refuses every address that is not a public
unicast one, however it is written:

- IPv4: this network 0/8, private 10/8, 172.16/12 and 192.168/16, shared (CGNAT) 100.64/10,
  loopback 127/8, link-local 169.254/16 (the metadata address 169.254.169.254 among them), IETF
  192.0.0/24, documentation 192.0.2/24, 198.51.100/24 and 203.0.113/24, the 6to4 relay anycast
  192.88.99/24, benchmarking 198.18/15, multicast 224/4, reserved 240/4 and broadcast.
- IPv6: unspecified, loopback, IPv4-mapped and IPv4-compatible (whatever they embed), unique
  local fc00::/7 (the metadata address fd00:ec2::254 among them), link-local fe80::/10,
  site-local fec0::/10, multicast, discard 100::/64, documentation 2001:db8::/32 and 3fff::/20,
  benchmarking 2001:2::/48, ORCHID, local-use NAT64 64:ff9b:1::/48, and everything outside the
  global unicast space 2000::/3. The forms that embed an IPv4 address are judged by it: NAT64
  64:ff9b::/96, 6to4 2002::/16 and Teredo 2001::/32 (its server and its client).
- Host names as written: `localhost` and its kin; a host written as a number in any other way
  than four decimal parts (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`: git, curl and
  getaddrinfo read them all as 127.0.0.1) is refused, not normalised; so are characters no host
  name has (a non-ASCII name could be mapped to one of the above by IDNA).

A name is resolved once, every address it has is checked, and the connection goes to one of
them (pinned): a name that resolves elsewhere a moment later (DNS rebinding) changes nothing.
`checked_address` does that; a lookup that fails says so (LookupFailed: try again later), and
nothing is ever sent to an address that was not checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from urllib.parse import urlsplit

__all__ = [
    "HostRefused",
    "LookupFailed",
    "Resolver",
    "address_refused",
    "allowed_host_names",
    "canonical_host",
    "checked_address",
    "default_port",
    "host_refused",
    "literal_address",
    "network_public",
    "network_refused",
    "system_resolver",
    "url_host_refused",
]

IPAddress = IPv4Address | IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]

_V4: tuple[tuple[IPv4Network, str], ...] = tuple(
    (IPv4Network(net), what)
    for net, what in (
        ("169.254.169.254/32", "cloud metadata"),
        ("0.0.0.0/8", "'this network'"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "shared (carrier-grade NAT)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "IETF protocol assignment"),
        ("192.0.2.0/24", "documentation"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation"),
        ("203.0.113.0/24", "documentation"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
    )
)

_V6: tuple[tuple[IPv6Network, str], ...] = tuple(
    (IPv6Network(net), what)
    for net, what in (
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fd00:ec2::254/128", "cloud metadata"),
        ("64:ff9b:1::/48", "local-use NAT64"),
        ("100::/64", "discard-only"),
        ("2001:2::/48", "benchmarking"),
        ("2001:10::/28", "ORCHID"),
        ("2001:20::/28", "ORCHIDv2"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing"),
        ("fc00::/7", "unique local (private)"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local"),
        ("ff00::/8", "multicast"),
    )
)
_GLOBAL_UNICAST = IPv6Network("2000::/3")
_MAPPED = IPv6Network("::ffff:0:0/96")
_COMPATIBLE = IPv6Network("::/96")
_NAT64 = IPv6Network("64:ff9b::/96")
_TEREDO = IPv6Network("2001::/32")
_SIXTOFOUR = IPv6Network("2002::/16")

# Names that mean this machine whatever DNS says (RFC 6761 `.localhost`, Debian's /etc/hosts).
_LOCAL_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "localhost4",
        "localhost4.localdomain4",
        "localhost6",
        "localhost6.localdomain6",
        "ip6-localhost",
        "ip6-loopback",
    }
)
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMBER_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_NETLOC = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(:[0-9]{1,5})?$")


def _parse(address: str | IPAddress) -> IPAddress:
    if isinstance(address, IPv4Address | IPv6Address):
        return address
    return ipaddress.ip_address(address)


def address_refused(address: str | IPAddress) -> str | None:
    """Why no connection may go to this IP address; None for a public unicast one. A string
    that is not an address raises ValueError; an IPv6 address with a zone (`fe80::1%eth0`) is
    refused."""
    text = str(address)
    if isinstance(address, str) and "%" in address:
        ipaddress.ip_address(address)  # ValueError if not an address at all
        return f"{text} is a scoped (zone) address"
    kind = _kind(_parse(address))
    return None if kind is None else f"{text} is {kind}"


def _an(what: str) -> str:
    return f"an {what}" if what[0].lower() in "aeiou" else f"a {what}"


def _kind(ip: IPAddress) -> str | None:
    """What a refused address is ("a loopback address"); None for a public unicast one."""
    if isinstance(ip, IPv4Address):
        return next((f"{_an(what)} address" for net, what in _V4 if ip in net), None)
    if ip in _MAPPED:
        return f"an IPv4-mapped address (of {ip.ipv4_mapped})"
    if ip in _COMPATIBLE and int(ip) > 1:
        return f"an IPv4-compatible address (of {IPv4Address(int(ip) & 0xFFFFFFFF)})"
    embedded: list[tuple[str, IPv4Address]] = []
    if ip in _NAT64:
        embedded.append(("NAT64", IPv4Address(int(ip) & 0xFFFFFFFF)))
    elif ip.sixtofour is not None:
        embedded.append(("6to4", ip.sixtofour))
    elif ip in _TEREDO and ip.teredo is not None:
        server, client = ip.teredo
        embedded += [("Teredo server", server), ("Teredo client", client)]
    if embedded:
        # Judged by the IPv4 address it leads to.
        for what, v4 in embedded:
            inner = _kind(v4)
            if inner is not None:
                return f"{_an(what)} address embedding {v4}, {inner}"
        return None
    for net, what in _V6:
        if ip in net:
            return f"{_an(what)} address"
    if ip not in _GLOBAL_UNICAST:
        return "a reserved address"
    return None


def network_refused(network: IPv4Network | IPv6Network) -> bool:
    """Whether every address of `network` is refused, one of the ranges above holding it whole.
    Errs toward False: a network across two ranges, or one judged by the IPv4 address each of
    its addresses embeds (NAT64, 6to4, Teredo), is not."""
    if isinstance(network, IPv4Network):
        return any(network.subnet_of(net) for net, _ in _V4)
    wholly = (*(net for net, _ in _V6), _MAPPED, _COMPATIBLE)
    return any(network.subnet_of(net) for net in wholly)


def network_public(network: IPv4Network | IPv6Network) -> bool:
    """Whether no address of `network` is refused. Errs toward False: a network holding a form
    judged by the IPv4 address it embeds (6to4, Teredo) is not."""
    if isinstance(network, IPv4Network):
        return not any(network.overlaps(net) for net, _ in _V4)
    judged = (*(net for net, _ in _V6), _SIXTOFOUR, _TEREDO)
    return network.subnet_of(_GLOBAL_UNICAST) and not any(network.overlaps(n) for n in judged)


def canonical_host(host: str) -> str:
    """A host as a URL names it, lowercased, without a final dot and IPv6 brackets."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host[:-1] if host.endswith(".") else host


def _inet_aton(text: str) -> IPv4Address | None:
    """What the C library's inet_aton (and so getaddrinfo, git and curl) makes of a host
    written as numbers: 1 to 4 parts, each decimal, octal (leading 0) or hex (0x); the last
    part fills the bytes left. None if it is no such number."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        if part.startswith("0x"):
            digits, base = part[2:] or "0", 16
        elif len(part) > 1 and part.startswith("0"):
            digits, base = part[1:], 8
        else:
            digits, base = part, 10
        try:
            values.append(int(digits, base))
        except ValueError:
            return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return IPv4Address(number)


def literal_address(host: str) -> IPAddress | None:
    """The address a host names when it is written as one (canonically or not), else None (a
    name). ValueError: a host that looks like an address but is none git or curl would read
    the same way (`999.1.1.1`, `1.2.3.4.5`, a bad IPv6 literal)."""
    host = canonical_host(host)
    if ":" in host:
        return ipaddress.ip_address(host)  # ValueError for a bad literal
    last = host.rsplit(".", 1)[-1]
    if not _NUMBER_LABEL.match(last):
        return None
    address = _inet_aton(host)
    if address is None:
        raise ValueError(f"{host!r} is not an IP address, and not a host name")
    return address


def host_refused(host: str) -> str | None:
    """Why a URL's host is refused as written, before any lookup; None for a public address
    written canonically, or for a name (checked once resolved: `checked_address`)."""
    raw = host.strip().lower().removeprefix("[").removesuffix("]")
    name = canonical_host(host)
    if not name:
        return "the URL names no host"
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return f"{name} names this machine (loopback)"
    if not name.isascii():
        return f"{name!r} is not an ASCII host name (write an international name in punycode)"
    try:
        address = literal_address(name)
    except ValueError as exc:
        return str(exc)
    if address is None:
        labels = name.split(".")
        if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
            return f"{name!r} is not a host name"
        return None
    if "%" in raw:
        return f"{raw} is a scoped (zone) address"
    kind = _kind(address)
    if isinstance(address, IPv4Address) and raw != str(address):
        # Refused, not normalised: what a check parses must be what git and curl parse.
        if kind is not None:
            return f"{raw!r} means {address}, {kind}"
        return f"{raw!r} is {address} written in another form: write it as {address}"
    return None if kind is None else f"{address} is {kind}"


def default_port(scheme: str) -> int:
    return {"https": 443, "http": 80, "git": 9418, "ssh": 22}.get(scheme, 0)


def url_host_refused(url: str, allowed_hosts: Iterable[str] = ()) -> str | None:
    """Why a URL's host is refused as written (`host_refused`), with the URL's authority
    checked to hold only a host and a port (what is parsed here is what git or curl parse);
    None when its host is one the operator allows by name."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - ValueError for a bad port
    except ValueError as exc:
        return f"the URL cannot be parsed: {exc}"
    netloc = parts.netloc.lower()
    if not _NETLOC.match(netloc):
        return "the URL's authority must be a host name or address and a port, nothing else"
    host = canonical_host(parts.hostname or "")
    if host in allowed_host_names(allowed_hosts):
        return None
    return host_refused(parts.hostname or "")


def allowed_host_names(hosts: Iterable[str]) -> frozenset[str]:
    """Operator-allowed hosts as `canonical_host` writes them."""
    return frozenset(canonical_host(h) for h in hosts if h.strip())


class HostRefused(Exception):
    """The policy refuses the host, or an address it resolves to; the message says why."""


class LookupFailed(Exception):
    """The host's name did not resolve (now): nothing was sent; try again later."""


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address getaddrinfo gives for a TCP connection to host:port."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


async def checked_address(host: str, port: int, resolver: Resolver = system_resolver) -> str:
    """The address to connect to for `host`: the host as written is checked (`host_refused`),
    a name resolved once and every address it has checked. HostRefused if any is refused,
    LookupFailed if the name does not resolve; never an unchecked address."""
    why = host_refused(host)
    if why is not None:
        raise HostRefused(why)
    literal = literal_address(host)
    if literal is not None:
        return str(literal)
    name = canonical_host(host)
    try:
        addresses = await resolver(name, port)
    except (OSError, UnicodeError) as exc:
        raise LookupFailed(f"{name} did not resolve: {exc}") from None
    if not addresses:
        raise LookupFailed(f"{name} has no address")
    for address in addresses:
        try:
            why = address_refused(address)
        except ValueError:
            why = f"{address!r} is not an address"
        if why is not None:
            raise HostRefused(f"{name} resolves to {why}")
    return addresses[0].split("%", 1)[0]
