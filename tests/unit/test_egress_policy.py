"""A task's egress policy and the operator's bound on it (shared/egress_policy.py): how a rule is
written and refused, which rules lie within which, and what a policy lets a connection reach,
a non-public address only where the operator's bound names it."""

from __future__ import annotations

import re
from ipaddress import IPv4Network, IPv6Network, ip_address

import pytest
from pydantic import ValidationError

from shared.address_policy import network_public, network_refused
from shared.egress_policy import (
    MAX_RULES,
    EgressPolicy,
    normal_rule,
    parse_rule,
    policy_outside,
    rules_within,
)


def _policy(*rules: str) -> EgressPolicy:
    return EgressPolicy(allow=rules)


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("pypi.org", "pypi.org"),
        ("  PyPI.org. ", "pypi.org"),
        ("*.GitHub.com", "*.github.com"),
        ("*.github.com:443", "*.github.com:443"),
        ("pypi.org:0443", "pypi.org:443"),
        ("203.0.113.7", "203.0.113.7"),
        ("203.0.113.7/32", "203.0.113.7"),
        ("203.0.113.0/24:443", "203.0.113.0/24:443"),
        ("10.20.0.0/16", "10.20.0.0/16"),
        ("2001:DB8:0::/32", "2001:db8::/32"),
        ("2001:db8::1", "2001:db8::1"),
        ("[2001:db8::1]:443", "[2001:db8::1]:443"),
        ("[2001:db8::/32]:443", "[2001:db8::/32]:443"),
        ("[2001:db8::1]", "2001:db8::1"),
        ("*", "*"),
        ("*:443", "*:443"),
        ("internal_index.corp", "internal_index.corp"),
    ],
)
def test_a_rule_has_one_written_form_that_reads_back_the_same(written: str, normal: str) -> None:
    assert normal_rule(written) == normal
    assert normal_rule(normal) == normal  # what is stored parses again to itself
    assert parse_rule(normal) == parse_rule(written)


@pytest.mark.parametrize(
    ("written", "why"),
    [
        ("", "an empty rule"),
        ("   ", "an empty rule"),
        ("pypi.org:https", "the port must be a number"),
        ("pypi.org:", "the port must be a number"),
        ("pypi.org:0", "'pypi.org:0': port 0 is out of range"),
        ("pypi.org:65536", "'pypi.org:65536': port 65536 is out of range"),
        ("[2001:db8::1]:70000", "port 70000 is out of range"),
        ("10.20.1.0/16", "write the network as 10.20.0.0/16"),
        ("[203.0.113.7]:443", "only an IPv6 address or network goes in brackets"),
        ("[pypi.org]", "only an IPv6 address or network goes in brackets"),
        ("*.com", "a wildcard must stand before a domain of two labels or more"),
        ("*.*.github.com", "is not a host name"),
        ("git*.com", "is not a host name"),
        ("a b.org", "is not a host name"),
        ("bücher.de", "is not a host name"),
        ("-bad.org", "is not a host name"),
        ("a..org", "is not a host name"),
        ("x" * 64 + ".org", "is not a host name"),
        ("fe80::1%eth0", "an address with a zone"),
        ("1.2.3", "write an address in dotted decimal"),
        ("127.1", "write an address in dotted decimal"),
    ],
)
def test_a_bad_rule_is_refused_saying_what_is_wrong(written: str, why: str) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        parse_rule(written)


def test_a_policy_is_validated_and_normalized_naming_the_bad_rule() -> None:
    assert _policy("PyPI.org", "*.GitHub.com:443").allow == ("pypi.org", "*.github.com:443")
    with pytest.raises(ValidationError, match=r"'a b\.org' is not a host name"):
        _policy("pypi.org", "a b.org")
    with pytest.raises(ValidationError, match="at most 64"):
        EgressPolicy(allow=tuple(f"h{i}.example.com" for i in range(MAX_RULES + 1)))
    with pytest.raises(ValidationError, match="Extra inputs"):
        EgressPolicy.model_validate({"allow": [], "deny": []})
    with pytest.raises(ValidationError, match="frozen"):
        _policy("pypi.org").allow = ()  # type: ignore[misc]
    assert _policy("a.org", "b.org").union(_policy("b.org", "c.org")).allow == (
        "a.org",
        "b.org",
        "c.org",
    )


@pytest.mark.parametrize(
    ("rule", "bound"),
    [
        ("pypi.org", "pypi.org"),
        ("pypi.org:443", "pypi.org"),
        ("pypi.org:443", "pypi.org:443"),
        ("api.github.com", "*.github.com"),
        ("*.api.github.com", "*.github.com"),
        ("*.github.com", "*.github.com"),
        ("pypi.org", "*"),
        ("*.github.com:443", "*"),
        ("*", "*"),
        ("*:443", "*"),
        ("8.8.8.8", "*"),
        ("8.8.8.0/24:53", "*"),
        ("2606:4700::/32", "*"),
        ("10.20.1.0/24", "10.20.0.0/16"),
        ("10.20.1.7", "10.20.0.0/16"),
        ("2001:db8:1::/48", "2001:db8::/32"),
    ],
)
def test_a_rule_within_its_bound(rule: str, bound: str) -> None:
    assert parse_rule(rule).within(parse_rule(bound))
    assert policy_outside(_policy(rule), _policy("other.org", bound)) is None


@pytest.mark.parametrize(
    ("rule", "bound"),
    [
        ("pypi.org", "files.pythonhosted.org"),
        ("pypi.org", "pypi.org:443"),  # any port is wider than 443
        ("pypi.org:80", "pypi.org:443"),
        ("github.com", "*.github.com"),  # the apex is not under its wildcard
        ("*.github.com", "github.com"),
        ("evilgithub.com", "*.github.com"),
        ("*", "pypi.org"),
        ("*", "*:443"),
        ("*", "0.0.0.0/0"),
        ("pypi.org", "0.0.0.0/0"),  # a name is not an address
        ("203.0.113.7", "pypi.org"),
        ("10.0.0.0/8", "*"),  # a non-public network: only an address rule of the bound
        ("10.20.0.0/16", "*"),
        ("8.0.0.0/5", "*"),  # public at its start, 10/8 inside
        ("0.0.0.0/0", "*"),
        ("::/0", "*"),
        ("2002::/16", "*"),  # 6to4: judged by the IPv4 address each embeds
        ("10.0.0.0/8", "10.20.0.0/16"),
        ("10.20.0.0/16", "2001:db8::/32"),
        ("::ffff:10.20.0.1", "10.20.0.0/16"),
    ],
)
def test_a_rule_outside_its_bound(rule: str, bound: str) -> None:
    assert not parse_rule(rule).within(parse_rule(bound))


def test_policy_outside_names_the_first_rule_outside_as_written() -> None:
    bound = _policy("pypi.org", "*.github.com:443", "10.20.0.0/16")
    assert policy_outside(_policy(), bound) is None
    assert policy_outside(_policy("api.github.com:443", "10.20.3.4"), bound) is None
    task = _policy("pypi.org", "API.github.com", "Example.com", "10.0.0.0/8")
    assert policy_outside(task, bound) == "api.github.com"
    assert policy_outside(task, _policy()) == "pypi.org"
    assert rules_within(task, bound).allow == ("pypi.org",)
    assert rules_within(task, _policy("*")).allow == ("pypi.org", "api.github.com", "example.com")


def test_allows_name_matches_names_and_ports_not_addresses() -> None:
    policy = _policy("pypi.org", "*.github.com:443", "203.0.113.7")
    assert policy.allows_name("pypi.org", 443) and policy.allows_name("PyPI.org.", 80)
    assert policy.allows_name("api.github.com", 443)
    assert policy.allows_name("a.b.github.com", 443)
    assert not policy.allows_name("api.github.com", 80)
    assert not policy.allows_name("github.com", 443)  # the apex
    assert not policy.allows_name("evilgithub.com", 443)
    assert not policy.allows_name("files.pythonhosted.org", 443)
    assert not policy.allows_name("www.pypi.org", 443)
    assert not policy.allows_name("203.0.113.7", 443)  # an address rule allows no name
    assert _policy("*").allows_name("anything.example", 22)
    assert not _policy().allows_name("pypi.org", 443)


def test_allows_address_public_for_anything_networks_as_written() -> None:
    anything = _policy("*")
    assert anything.allows_address(ip_address("8.8.8.8"), 53)
    assert anything.allows_address(ip_address("2606:4700::1111"), 443)
    for private in ("10.0.0.1", "127.0.0.1", "169.254.169.254", "::1", "fd00:ec2::254"):
        assert not anything.allows_address(ip_address(private), 443), private
    policy = _policy("203.0.113.0/24:443", "10.20.0.0/16", "2001:db8::/32", "pypi.org")
    assert policy.allows_address(ip_address("203.0.113.9"), 443)
    assert not policy.allows_address(ip_address("203.0.113.9"), 80)
    assert policy.allows_address(ip_address("10.20.5.5"), 22)  # as written: the bound judges
    assert not policy.allows_address(ip_address("10.21.0.1"), 22)
    assert policy.allows_address(ip_address("2001:db8::5"), 443)
    assert not policy.allows_address(ip_address("::ffff:10.20.5.5"), 22)
    assert not _policy("pypi.org").allows_address(ip_address("151.101.0.223"), 443)


def test_names_private_only_for_an_address_rule_wholly_non_public() -> None:
    bound = _policy("10.20.0.0/16:443", "169.254.169.254", "fd12::/16", "*", "0.0.0.0/0", "::/0")
    assert bound.names_private(ip_address("10.20.1.1"), 443)
    assert not bound.names_private(ip_address("10.20.1.1"), 80)  # another port
    assert bound.names_private(ip_address("169.254.169.254"), 80)  # the operator said so
    assert bound.names_private(ip_address("fd12::1"), 443)
    # `*`, 0.0.0.0/0 and ::/0 hold private addresses but name none of them.
    for private in ("10.21.0.1", "127.0.0.1", "192.168.1.1", "::1", "fd00:ec2::254"):
        assert not bound.names_private(ip_address(private), 443), private
    assert not _policy("0.0.0.0/1").names_private(ip_address("10.0.0.1"), 443)
    assert not _policy("8.0.0.0/5").names_private(ip_address("10.0.0.1"), 443)
    assert not _policy("8.8.8.8").names_private(ip_address("8.8.8.8"), 53)  # public


def test_networks_wholly_refused_or_wholly_public() -> None:
    assert network_refused(IPv4Network("10.20.0.0/16"))
    assert network_refused(IPv4Network("169.254.169.254/32"))
    assert network_refused(IPv6Network("fd00::/8"))
    assert network_refused(IPv6Network("::ffff:0:0/112"))
    for mixed in ("0.0.0.0/0", "0.0.0.0/1", "8.0.0.0/5", "8.8.8.0/24"):
        assert not network_refused(IPv4Network(mixed)), mixed
    assert not network_refused(IPv6Network("::/0"))
    assert network_public(IPv4Network("8.8.8.0/24"))
    assert network_public(IPv6Network("2606:4700::/32"))
    for mixed in ("8.0.0.0/5", "0.0.0.0/0", "10.0.0.0/8", "172.0.0.0/8"):
        assert not network_public(IPv4Network(mixed)), mixed
    for mixed in ("::/0", "2000::/3", "2001:db8::/32", "2002::/16", "fc00::/7"):
        assert not network_public(IPv6Network(mixed)), mixed
