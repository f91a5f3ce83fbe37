"""Webhook rules that need no running system: the signature a receiver checks, which targets
are refused, what a webhook may name, and the retry delays."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import time

import httpx
import pytest
from pydantic import ValidationError

from services.gateway.webhooks.delivery import WebhookDeliverer
from services.gateway.webhooks.models import DeliveryAttempt, WebhookSpec
from services.gateway.webhooks.notifications import sign
from services.gateway.webhooks.policy import DeliveryPolicy
from services.gateway.webhooks.store import DeliveryRecord, TaskWebhook
from services.gateway.webhooks.targets import WebhookTarget, pinned_target, url_refused
from shared.address_policy import Resolver, address_refused
from shared.events import AgentState, AgentStateChangedObservation, EventSource


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    header = sign(b"key", b'{"a":1}', 1_700_000_000)
    expected = hmac.new(b"key", b'1700000000.{"a":1}', hashlib.sha256).hexdigest()
    assert header == f"t=1700000000,v1={expected}"
    assert sign(b"key", b'{"a":2}', 1_700_000_000) != header
    assert sign(b"key", b'{"a":1}', 1_700_000_001) != header


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "192.168.0.10",
        "172.16.5.5",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "0.0.0.0",
        "::ffff:127.0.0.1",
        "224.0.0.1",
    ],
)
def test_private_addresses_are_refused(address: str) -> None:
    assert address_refused(address) is not None


def test_public_addresses_pass() -> None:
    assert address_refused("93.184.216.34") is None
    assert address_refused("2606:2800:220:1:248:1893:25c8:1946") is None


def test_urls_refused_when_given_unless_allowed() -> None:
    assert url_refused("http://127.0.0.1:9/x", allow_private=False) is not None
    assert url_refused("http://localhost/x", allow_private=False) is not None
    assert url_refused("http://[::1]/x", allow_private=False) is not None
    refused = url_refused("https://10.0.0.8/x", allow_private=False)
    assert refused is not None and "DECKHANDS_WEBHOOK_ALLOW_PRIVATE_TARGETS" in refused
    assert url_refused("http://127.0.0.1:9/x", allow_private=True) is None
    # The special ranges and the odd ways of writing an address (shared/address_policy.py).
    for url in (
        "http://100.64.0.1/x",
        "http://192.88.99.1/x",
        "http://[fec0::1]/x",
        "http://[2002:7f00:1::1]/x",
        "http://[64:ff9b::7f00:1]/x",
        "http://[fd00:ec2::254]/x",
        "http://2130706433:9/x",
        "http://0x7f.1:9/x",
        "http://0177.0.0.1:9/x",
        "http://127.1:9/x",
    ):
        assert url_refused(url, allow_private=False) is not None, url
    # A name is resolved and checked at each delivery, not when it is given.
    assert url_refused("https://hooks.example.com/x", allow_private=False) is None


def test_a_webhook_is_http_with_a_secret_name() -> None:
    WebhookSpec(url="https://example.com/hook", signing_secret="WEBHOOK_KEY")
    for url in ("ftp://example.com/x", "file:///etc/passwd", "https://user:pw@example.com/"):
        with pytest.raises(ValidationError):
            WebhookSpec(url=url, signing_secret="WEBHOOK_KEY")
    with pytest.raises(ValidationError):
        WebhookSpec(url="https://example.com/hook", signing_secret="not a name")


def test_retry_delays_double_up_to_the_cap() -> None:
    policy = DeliveryPolicy(
        timeout_s=1,
        backoff_s=2,
        backoff_max_s=10,
        deadline_s=100,
        max_attempts=5,
        allow_private=False,
        concurrency=1,
    )
    for attempt, base in ((1, 2), (2, 4), (3, 8), (4, 10), (9, 10)):
        assert base <= policy.backoff(attempt) <= base * 1.1


# --- the address a POST goes to is the one checked (DNS rebinding) ----------------------------


@pytest.mark.parametrize(
    ("url", "address", "expected_url", "host", "sni"),
    [
        (
            "http://hooks.example.com:8080/in?x=1",
            "93.184.216.34",
            "http://93.184.216.34:8080/in?x=1",
            "hooks.example.com:8080",
            None,
        ),
        (
            "https://hooks.example.com/in",
            "93.184.216.34",
            "https://93.184.216.34/in",
            "hooks.example.com",
            "hooks.example.com",
        ),
        (
            "https://hooks.example.com:8443/",
            "2606:2800:220:1::1",
            "https://[2606:2800:220:1::1]:8443/",
            "hooks.example.com:8443",
            "hooks.example.com",
        ),
    ],
)
def test_a_pinned_target_names_the_checked_address_and_keeps_the_host_name(
    url: str, address: str, expected_url: str, host: str, sni: str | None
) -> None:
    target = pinned_target(url, address)
    assert target.url == expected_url
    assert target.headers == {"Host": host}
    assert target.extensions.get("sni_hostname") == sni


async def test_a_pinned_post_reaches_the_address_whatever_the_name_resolves_to() -> None:
    # The name does not resolve at all (.invalid): the connection goes to the pinned address,
    # and the receiver still sees the name the webhook was given.
    seen: list[bytes] = []

    async def receive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(receive, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        target = pinned_target(f"http://hooks.invalid:{port}/in", "127.0.0.1")
        async with httpx.AsyncClient() as client:
            request = client.build_request(
                "POST", target.url, content=b"{}", headers=target.headers
            )
            answer = await client.send(request)
    finally:
        server.close()
        await server.wait_closed()
    assert answer.status_code == 204
    head = seen[0].decode().lower()
    assert head.startswith("post /in http/1.1") and f"host: hooks.invalid:{port}\r\n" in head


async def test_a_name_that_resolves_to_a_private_address_is_refused_at_delivery() -> None:
    policy = DeliveryPolicy(
        timeout_s=1,
        backoff_s=1,
        backoff_max_s=1,
        deadline_s=1,
        max_attempts=1,
        allow_private=False,
        concurrency=1,
    )
    deliverer = WebhookDeliverer(
        lambda: None,  # type: ignore[arg-type,return-value]
        None,  # type: ignore[arg-type]
        None,
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        policy,
    )
    refused = await deliverer._target("http://localhost:9/in")
    assert not isinstance(refused, WebhookTarget)
    assert "loopback" in refused.reason


# --- a name whose lookup fails is never sent to (issue 24) ------------------------------------


class _Store:
    """The webhook records deliver() reads and writes, in memory."""

    def __init__(self) -> None:
        self.attempts: list[DeliveryAttempt] = []
        self.count = 0

    async def delivery(self, delivery_id: str) -> DeliveryRecord | None:
        return None

    async def begin_attempt(self, delivery_id: str) -> DeliveryRecord:
        self.count += 1
        return DeliveryRecord(first_attempt_at=time.time(), attempts=self.count, done=False)

    async def record(self, task_id: str, attempt: DeliveryAttempt) -> None:
        self.attempts.append(attempt)


class _Secrets:
    async def read(self, tenant_id: str, name: str) -> str:
        return "signing-key"


def _deliverer(resolve: Resolver, store: _Store | None = None) -> WebhookDeliverer:
    policy = DeliveryPolicy(
        timeout_s=5,
        backoff_s=1,
        backoff_max_s=1,
        deadline_s=60,
        max_attempts=5,
        allow_private=False,
        concurrency=1,
    )
    return WebhookDeliverer(
        lambda: None,  # type: ignore[arg-type,return-value]
        store,  # type: ignore[arg-type]
        _Secrets(),  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        policy,
        resolve=resolve,
    )


async def _failing_lookup(host: str, port: int) -> list[str]:
    raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


async def test_a_failed_lookup_sends_nothing_and_is_tried_again() -> None:
    """Before: a first lookup that failed sent the POST unpinned, to whatever the HTTP client's
    own lookup found a moment later, unchecked. Now nothing is asked of the HTTP client: the
    attempt is recorded as failed and tried again later."""
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    store = _Store()
    deliverer = _deliverer(_failing_lookup, store)
    # What start() makes, without NATS; every request it is asked to send is recorded.
    deliverer._http = httpx.AsyncClient(follow_redirects=False, event_hooks={"request": [record]})
    try:
        url = "http://rebind.example:8080/in"
        target = await deliverer._target(url)
        assert not isinstance(target, WebhookTarget) and "did not resolve" in target.reason
        webhook = TaskWebhook(
            tenant_id="t", spec=WebhookSpec(url=url, signing_secret="WEBHOOK_KEY")
        )
        notice = AgentStateChangedObservation(
            task_id="task-1", source=EventSource.ENVIRONMENT, agent_state=AgentState.FINISHED
        )
        delay = await deliverer.deliver(notice, webhook)
    finally:
        await deliverer.stop()
    assert sent == []
    assert delay is not None and delay > 0
    [attempt] = store.attempts
    assert attempt.outcome == "retrying" and attempt.status_code is None
    assert "not sent" in attempt.error and "did not resolve" in attempt.error


async def test_a_lookup_is_checked_every_time_not_only_the_first() -> None:
    """A name that resolves to a public address once and to loopback the next time (DNS
    rebinding across attempts): each attempt's answer is checked and pinned."""
    answers = [["93.184.216.34"], ["127.0.0.1"]]

    async def rebinding(host: str, port: int) -> list[str]:
        return answers.pop(0)

    deliverer = _deliverer(rebinding)
    first = await deliverer._target("https://hooks.example/in")
    assert isinstance(first, WebhookTarget) and first.url == "https://93.184.216.34/in"
    second = await deliverer._target("https://hooks.example/in")
    assert not isinstance(second, WebhookTarget) and "loopback" in second.reason
