"""The address policy of outbound connections made for a tenant (shared/address_policy.py):
every special range, IPv4 and IPv6, the forms that embed an IPv4 address, the odd ways a host
can be written as a number, and a name resolved once with every address checked."""

from __future__ import annotations

import pytest

from shared.address_policy import (
    HostRefused,
    LookupFailed,
    address_refused,
    allowed_host_names,
    checked_address,
    host_refused,
    literal_address,
    url_host_refused,
)


@pytest.mark.parametrize(
    ("address", "what"),
    [
        # IPv4
        ("0.0.0.0", "this network"),
        ("0.1.2.3", "this network"),
        ("10.0.0.1", "private"),
        ("10.255.255.255", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.100.100.200", "carrier-grade NAT"),  # a cloud's metadata address
        ("100.127.255.254", "carrier-grade NAT"),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.0.0.192", "IETF"),
        ("192.0.2.1", "documentation"),
        ("192.88.99.1", "6to4 relay"),
        ("192.168.1.1", "private"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
        # IPv6
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("0:0:0:0:0:0:0:1", "loopback"),
        ("::ffff:127.0.0.1", "IPv4-mapped"),
        ("::ffff:7f00:1", "IPv4-mapped"),
        ("::ffff:8.8.8.8", "IPv4-mapped"),  # mapped is refused whatever it maps
        ("::127.0.0.1", "IPv4-compatible"),
        ("::8.8.8.8", "IPv4-compatible"),
        ("64:ff9b::127.0.0.1", "NAT64 address embedding 127.0.0.1, a loopback"),
        ("64:ff9b::a9fe:a9fe", "NAT64 address embedding 169.254.169.254"),
        ("64:ff9b:1::1", "local-use NAT64"),
        ("100::1", "discard-only"),
        ("2001:2::1", "benchmarking"),
        ("2001:10::1", "ORCHID"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("2002:7f00:1::1", "6to4 address embedding 127.0.0.1"),
        ("2002:a00:1::", "6to4 address embedding 10.0.0.1, a private"),
        ("2002:a9fe:a9fe::1", "6to4 address embedding 169.254.169.254"),
        # Teredo: server 65.54.227.120, client (inverted) 127.0.0.1 / 192.0.2.45
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo client address embedding 127.0.0.1"),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "Teredo client address embedding 192.0.2.45"),
        ("2001:0:7f00:1::1", "Teredo server address embedding 127.0.0.1"),
        ("fc00::1", "unique local"),
        ("fd00:ec2::254", "metadata"),
        ("fd12:3456::1", "unique local"),
        ("fe80::1", "link-local"),
        ("febf::1", "link-local"),
        ("fec0::1", "site-local"),
        ("feff::1", "site-local"),
        ("ff02::1", "multicast"),
        ("ff0e::1", "multicast"),
        ("5f00::1", "segment routing"),
        ("4000::1", "reserved"),
        ("e000::1", "reserved"),
        ("fe80::1%eth0", "scoped"),
    ],
)
def test_every_special_address_is_refused_and_named(address: str, what: str) -> None:
    reason = address_refused(address)
    assert reason is not None and what in reason, reason


@pytest.mark.parametrize(
    "address",
    [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.216.34",
        "100.63.255.255",  # just below CGNAT
        "100.128.0.0",  # just above it
        "172.32.0.1",
        "198.20.0.1",
        "2606:4700:4700::1111",
        "2a00:1450:4001:80b::200e",
        "64:ff9b::808:808",  # NAT64 of a public address (DNS64 networks use these)
        "2002:808:808::1",  # 6to4 of a public address
        "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo of 8.8.8.8 by a public server
    ],
)
def test_public_addresses_pass(address: str) -> None:
    assert address_refused(address) is None


def test_a_non_address_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        address_refused("example.com")


@pytest.mark.parametrize(
    ("host", "means"),
    [
        ("2130706433", "127.0.0.1"),  # decimal
        ("0x7f000001", "127.0.0.1"),  # hex
        ("017700000001", "127.0.0.1"),  # octal
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("0x0", "0.0.0.0"),
        ("169.254.43518", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("100.64.1", "100.64.0.1"),
        ("127.0.0.1.", "127.0.0.1"),  # a final dot
        ("1.2.3.0x4", "1.2.3.4"),  # public, but not written canonically
        ("010.8.8.8", "8.8.8.8"),
        ("134744072", "8.8.8.8"),
    ],
)
def test_numbers_written_oddly_are_refused_naming_the_address(host: str, means: str) -> None:
    address = literal_address(host)
    assert address is not None and str(address) == means
    reason = host_refused(host)
    assert reason is not None and means in reason, reason


@pytest.mark.parametrize(
    "host",
    ["999.1.1.1", "1.2.3.4.5", "08.1.1.1", "0x1g.1", "256.0.0.1", "1.16777216", "host.123"],
)
def test_numbers_that_are_no_address_are_refused(host: str) -> None:
    with pytest.raises(ValueError):
        literal_address(host)
    assert host_refused(host) is not None


@pytest.mark.parametrize(
    ("host", "what"),
    [
        ("localhost", "this machine"),
        ("LOCALHOST", "this machine"),
        ("localhost.", "this machine"),
        ("api.localhost", "this machine"),
        ("localhost.localdomain", "this machine"),
        ("ip6-localhost", "this machine"),
        ("ip6-loopback", "this machine"),
        ("127.0.0.1", "loopback"),
        ("[::1]", "loopback"),
        ("::ffff:7f00:1", "IPv4-mapped"),
        ("[::ffff:127.0.0.1]", "IPv4-mapped"),
        ("10.0.0.8", "private"),
        ("fe80::1%25eth0", "scoped"),
        # IDNA maps fullwidth letters and digits to localhost and 127.0.0.1
        ("".join(chr(0xFEE0 + ord(c)) for c in "localhost"), "ASCII"),
        ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "ASCII"),
        ("a..b", "not a host name"),
        ("-a.example", "not a host name"),
        ("a b.example", "not a host name"),
        ("", "no host"),
    ],
)
def test_hosts_refused_as_written(host: str, what: str) -> None:
    reason = host_refused(host)
    assert reason is not None and what in reason, reason


@pytest.mark.parametrize(
    "host",
    [
        "example.com",
        "git.example.com.",
        "Example.COM",
        "a_b.example",
        "8.8.8.8",
        "xn--bcher-kva.example",
    ],
)
def test_names_and_public_literals_pass_as_written(host: str) -> None:
    assert host_refused(host) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:4222/x.git",
        "git://[::1]/x",
        "https://0x7f000001/x",
        "https://2130706433/x",
        "http://localhost:6379/",
        "http://100.64.0.1/x",
        "http://169.254.169.254/latest/meta-data/",
        "https://example.com\\@127.0.0.1/x",  # an authority a parser could read two ways
        "https://example.com:99999/x",
        "https://[fe80::1%25eth0]/x",
    ],
)
def test_urls_refused_as_written(url: str) -> None:
    assert url_host_refused(url) is not None


def test_the_operator_allows_named_hosts() -> None:
    allowed = allowed_host_names(["Git.Internal.", "127.0.0.1", " "])
    assert allowed == {"git.internal", "127.0.0.1"}
    assert url_host_refused("https://git.internal/x.git", allowed) is None
    assert url_host_refused("git://127.0.0.1:9418/x", allowed) is None
    # Only the host named: another way of writing its address is not it.
    assert url_host_refused("git://127.1:9418/x", allowed) is not None
    assert url_host_refused("git://localhost:9418/x", allowed) is not None
    # The authority is checked even for an allowed host.
    assert url_host_refused("https://git.internal\\@x/x.git", allowed) is not None


# --- a name is resolved once and every address checked ---------------------------------------


class _Resolver:
    def __init__(self, *answers: list[str] | OSError) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer


async def test_a_public_name_is_pinned_to_its_checked_address() -> None:
    resolve = _Resolver(["93.184.216.34", "2606:2800:220:1::1"])
    assert await checked_address("Git.Example.COM.", 443, resolve) == "93.184.216.34"
    assert resolve.asked == [("git.example.com", 443)]  # once


@pytest.mark.parametrize(
    "addresses",
    [
        ["127.0.0.1"],
        ["93.184.216.34", "10.0.0.1"],  # one bad address among good ones
        ["::ffff:127.0.0.1"],
        ["fd00:ec2::254"],
        ["100.64.0.1"],
        ["fe80::1%eth0"],
    ],
)
async def test_a_name_with_any_refused_address_is_refused(addresses: list[str]) -> None:
    with pytest.raises(HostRefused, match="resolves to"):
        await checked_address("rebind.example", 80, _Resolver(addresses))


async def test_a_name_that_does_not_resolve_is_a_lookup_failure_not_an_address() -> None:
    with pytest.raises(LookupFailed):
        await checked_address("nx.example", 80, _Resolver(OSError(-2, "Name or service not known")))
    with pytest.raises(LookupFailed):
        await checked_address("empty.example", 80, _Resolver([]))


async def test_literals_and_local_names_are_never_looked_up() -> None:
    resolve = _Resolver()
    assert await checked_address("8.8.8.8", 80, resolve) == "8.8.8.8"
    assert await checked_address("[2606:4700:4700::1111]", 80, resolve) == "2606:4700:4700::1111"
    for host in ("localhost", "2130706433", "127.0.0.1", "[::1]"):
        with pytest.raises(HostRefused):
            await checked_address(host, 80, resolve)
    assert resolve.asked == []


async def test_the_system_resolver_finds_loopback_names_refused() -> None:
    # `localhost` is refused by name; the system's own answer for it is checked too.
    from shared.address_policy import system_resolver

    addresses = await system_resolver("localhost", 80)
    assert addresses and all(address_refused(a) is not None for a in addresses)
