"""The egress proxy's check of a destination against a task's policy
(services/egress/destination_check.py), with a resolver that says what the test needs."""

from __future__ import annotations

import pytest

from services.egress.destination_check import checked_destination
from services.egress.errors import Refused
from shared.egress_policy import EgressPolicy


def _resolver(table: dict[str, list[str]]):  # type: ignore[no-untyped-def]
    async def resolve(name: str, port: int) -> list[str]:
        if name not in table:
            raise OSError("no such name")
        return table[name]

    return resolve


DNS = _resolver(
    {
        "pypi.org": ["151.101.0.223", "151.101.64.223"],
        "api.github.com": ["140.82.112.6"],
        "rebind.example.com": ["140.82.112.6", "127.0.0.1"],
        "metadata.example.com": ["169.254.169.254"],
        "index.corp.example": ["10.20.0.5"],
    }
)


async def _check(allow: list[str], host: str, port: int = 443) -> str:
    return await checked_destination(EgressPolicy(allow=tuple(allow)), host, port, 2.0, DNS)


async def test_an_allowed_name_goes_to_the_address_checked() -> None:
    assert await _check(["pypi.org"], "pypi.org") == "151.101.0.223"
    assert await _check(["*.github.com"], "API.GitHub.com.") == "140.82.112.6"


@pytest.mark.parametrize(
    ("allow", "host", "port", "reason"),
    [
        (["pypi.org"], "files.pythonhosted.org", 443, "not_allowed"),
        (["*.github.com"], "github.com", 443, "not_allowed"),  # not the apex
        (["pypi.org:443"], "pypi.org", 80, "not_allowed"),
        (["*"], "rebind.example.com", 443, "private_address"),  # one address is loopback
        (["*"], "metadata.example.com", 80, "private_address"),
        (["*"], "169.254.169.254", 80, "not_allowed"),  # `*` is public addresses only
        (["*"], "127.0.0.1", 6379, "not_allowed"),
        (["*"], "2130706433", 80, "not_allowed"),  # 127.0.0.1 written as a number
        (["*"], "nowhere.example.com", 443, "lookup_failed"),
        (["index.corp.example"], "index.corp.example", 443, "private_address"),
        (["10.20.0.0/16:80", "index.corp.example"], "index.corp.example", 443, "private_address"),
    ],
)
async def test_what_the_policy_does_not_allow_is_refused_with_why(
    allow: list[str], host: str, port: int, reason: str
) -> None:
    with pytest.raises(Refused) as refused:
        await _check(allow, host, port)
    assert refused.value.reason == reason
    assert host.lower().rstrip(".") in refused.value.message


async def test_a_private_address_is_reached_only_where_the_policy_names_it() -> None:
    allow = ["index.corp.example", "10.20.0.0/16"]
    assert await _check(allow, "index.corp.example") == "10.20.0.5"
    assert await _check(["10.20.0.5:8080"], "10.20.0.5", 8080) == "10.20.0.5"
    assert await _check(["127.0.0.2:9000"], "127.0.0.2", 9000) == "127.0.0.2"


async def test_the_refusal_tells_the_agent_what_it_may_reach() -> None:
    with pytest.raises(Refused) as refused:
        await _check(["pypi.org", "*.github.com"], "evil.example.com")
    assert "pypi.org, *.github.com" in refused.value.message
    assert "ask for it to be added" in refused.value.message
