"""Where a webhook may POST: a URL refused when it is given, and the target of a delivery, pinned
to the address its host was checked at (shared/address_policy.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from shared.address_policy import url_host_refused

__all__ = ["TargetLookupFailed", "TargetRefused", "WebhookTarget", "pinned_target", "url_refused"]


def url_refused(url: str, allow_private: bool) -> str | None:
    """Why a webhook URL is refused when it is given (a literal address the address policy
    refuses, however written, or a local name); names are resolved and checked again at each
    delivery (shared/address_policy.py)."""
    if allow_private:
        return None
    reason = url_host_refused(url)
    if reason is None:
        return None
    return (
        f"webhook URL {url!r}: {reason}; the operator allows such targets with "
        "DECKHANDS_WEBHOOK_ALLOW_PRIVATE_TARGETS=true"
    )


@dataclass(frozen=True)
class TargetRefused:
    """The URL's host may not be reached (the address policy): the delivery gives up."""

    reason: str


@dataclass(frozen=True)
class TargetLookupFailed:
    """The URL's host name could not be looked up now: nothing sent, tried again later."""

    reason: str


@dataclass(frozen=True)
class WebhookTarget:
    """Where a POST goes: its URL, and when pinned to an address the headers and request
    extensions that keep the URL's host name for HTTP and TLS."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    extensions: dict[str, Any] = field(default_factory=dict)


def pinned_target(url: str, address: str) -> WebhookTarget:
    """A POST to `url` made to `address`, as if the URL's host had resolved to it: the URL names
    the address, the Host header the name, and for https the TLS server name is the host's, so
    its certificate is checked against the name."""
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    extensions: dict[str, Any] = {}
    if parts.scheme == "https":
        extensions["sni_hostname"] = parts.hostname or ""
    return WebhookTarget(
        parts._replace(netloc=netloc).geturl(),
        headers={"Host": parts.netloc.rpartition("@")[2]},  # the URL's own host[:port]
        extensions=extensions,
    )
