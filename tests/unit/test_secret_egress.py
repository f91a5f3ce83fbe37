"""A secret bound to hosts (issue 27): which requests get it, and which bindings are refused
when it is written (a header that routes or frames a request, a format that is not one `{}`,
a value that would end the header)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.secret_egress import SecretEgress, bad_bound_value


def test_it_covers_its_hosts_and_no_other() -> None:
    bound = SecretEgress(hosts=("api.github.com", "*.corp.example", "203.0.113.7:8443"))
    assert bound.covers("api.github.com", 443)
    assert bound.covers("API.GitHub.com.", 443)
    assert not bound.covers("github.com", 443)
    assert not bound.covers("api.github.com.attacker.example", 443)
    assert bound.covers("build.corp.example", 443)
    assert not bound.covers("corp.example", 443)
    assert bound.covers("203.0.113.7", 8443)
    assert not bound.covers("203.0.113.7", 443)
    # A name is not its address, nor an address a name.
    assert not bound.covers("203.0.113.8", 8443)


def test_the_header_value_has_the_secret_where_the_format_says() -> None:
    assert SecretEgress(hosts=("h.example",)).header_value("s3cr3t") == "s3cr3t"
    bearer = SecretEgress(hosts=("h.example",), format="Bearer {}")
    assert bearer.header_value("s{}t") == "Bearer s{}t"
    assert bearer.header == "Authorization"


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"hosts": ()}, "at least 1"),
        ({"hosts": ("*",)}, "not to `*`"),
        ({"hosts": ("10.0.0.0/8",)}, "not a network"),
        ({"hosts": ("not a host",)}, "is not a host name"),
        ({"hosts": ("h.example",), "header": "Host"}, "routes|where a request goes"),
        ({"hosts": ("h.example",), "header": "Content-Length"}, "framed"),
        ({"hosts": ("h.example",), "header": "X Bad"}, "not an HTTP header name"),
        ({"hosts": ("h.example",), "format": "Bearer"}, "once"),
        ({"hosts": ("h.example",), "format": "{} {}"}, "once"),
        ({"hosts": ("h.example",), "format": "{x}{}"}, "no other brace"),
        ({"hosts": ("h.example",), "format": "a\r\nX-Other: {}"}, "line break"),
        ({"hosts": ("h.example",), "extra": 1}, "Extra inputs"),
    ],
)
def test_a_bad_binding_is_refused_with_the_reason(fields: dict[str, object], why: str) -> None:
    with pytest.raises(ValidationError, match=why):
        SecretEgress.model_validate(fields)


def test_a_bound_value_may_not_end_its_header() -> None:
    assert bad_bound_value("ghp_abc\tdef") is None
    for value in ("a\r\nX-Evil: 1", "a\nb", "a\x00b", "a\x7fb"):
        assert "control character" in str(bad_bound_value(value))
