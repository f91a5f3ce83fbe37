"""Delivering webhooks: a durable JetStream consumer of the tasks' state changes, shared by every
gateway replica, POSTs each notification and is acknowledged only once the attempt is recorded.

Why in the gateway: it already holds what a delivery needs (NATS, Redis, the tenants' secrets,
the task records) and runs as several replicas; a delivery is a short outbound POST, bounded in
number (`webhook_concurrency`) and time (`webhook_timeout_s`), so it needs no service of its own.

What it reads: the controller copies each state change it logs to `deckhands.notices.<task>`
(stream `DECKHANDS_NOTICES`, a work queue), so the consumer sees a few messages per task, not every
event of the log. How it survives restarts: the consumer `webhooks` is never removed and the stream
keeps what it has not acknowledged, so changes made while every gateway is down wait for it. A
change that needs no notification (no webhook, or a state not notified) is acknowledged at once. A
notification is acknowledged after its successful (or final) attempt is recorded in Redis; a failed
attempt is recorded and the message negatively acknowledged with the backoff as its delay, so
JetStream keeps the retry schedule and any replica takes the next attempt. A process killed
mid-attempt leaves the message unacknowledged: it comes back after `ack_wait`. Before sending, the
record is checked: a notification recorded as delivered is never sent again (a lost
acknowledgement), so a receiver sees it twice only if a process died between the receiver's answer
and the record; the `Deckhands-Delivery-Id` header (and the body's `id`) lets it tell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
import nats.errors
from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError
from redis.asyncio import Redis

from shared.address_policy import (
    HostRefused,
    LookupFailed,
    Resolver,
    checked_address,
    default_port,
    system_resolver,
    url_host_refused,
)
from shared.events import AgentStateChangedObservation, EventAdapter
from shared.health import CONSUMER_GAUGE_REFRESH_S, CONSUMER_PENDING
from shared.secrets_store import SecretNotFound, SecretsStore, SecretUnreadable
from shared.state_store import TaskStateStore
from shared.subjects import NOTICES_STREAM, notice_subject

from .context import GatewayContext
from .metrics import DELIVERIES
from .settings import GatewaySettings
from .task_records import TaskRecords
from .webhooks import (
    NOTIFIED_STATES,
    SIGNATURE_HEADER,
    WAITING_STATES,
    DeliveryAttempt,
    TaskWebhook,
    WebhookStore,
    body_bytes,
    event_type,
    sign,
)

__all__ = [
    "DURABLE",
    "DeliveryPolicy",
    "WebhookDeliverer",
    "WebhookTarget",
    "build_deliverer",
    "pinned_target",
]

log = logging.getLogger("deckhands.gateway.webhooks")

DURABLE = "webhooks"
_ACK_WAIT_S = 60.0
_FETCH_BATCH = 64
_MARKER = b'"agent_state_changed"'


class DeliveryPolicy:
    def __init__(
        self,
        *,
        timeout_s: float,
        backoff_s: float,
        backoff_max_s: float,
        deadline_s: float,
        max_attempts: int,
        allow_private: bool,
        concurrency: int,
    ) -> None:
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.deadline_s = deadline_s
        self.max_attempts = max_attempts
        self.allow_private = allow_private
        self.concurrency = concurrency

    def backoff(self, attempts: int) -> float:
        """Delay after the `attempts`-th failure: doubling, capped, up to 10% jitter."""
        delay = min(self.backoff_s * 2.0 ** (attempts - 1), self.backoff_max_s)
        return delay * (1 + random.random() / 10)


class WebhookDeliverer:
    def __init__(
        self,
        jetstream: Callable[[], JetStreamContext],
        webhooks: WebhookStore,
        secrets: SecretsStore | None,
        states: TaskStateStore,
        records: TaskRecords,
        policy: DeliveryPolicy,
        connected: Callable[[], bool] = lambda: True,
        resolve: Resolver = system_resolver,
    ) -> None:
        self._jetstream = jetstream
        self._connected = connected
        self._resolve = resolve
        self.webhooks = webhooks
        self.secrets = secrets
        self.states = states
        self.records = records
        self.policy = policy
        self._slots = asyncio.Semaphore(policy.concurrency)
        self._loop: asyncio.Task[None] | None = None
        self._gauge: asyncio.Task[None] | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        self._http = httpx.AsyncClient(
            timeout=self.policy.timeout_s,
            follow_redirects=False,  # a redirect could lead anywhere, past the target checks
            headers={"User-Agent": "deckhands-webhooks/1"},
        )
        subscription = await self._jetstream().pull_subscribe(
            notice_subject("*"),
            durable=DURABLE,
            stream=NOTICES_STREAM,
            config=ConsumerConfig(
                durable_name=DURABLE,
                deliver_policy=DeliverPolicy.ALL,  # the work queue holds only what is due
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=_ACK_WAIT_S,
                max_deliver=-1,  # the deadline and max_attempts end a notification, not NATS
                max_ack_pending=10_000,
                description="Webhook notifications of task states (gateway)",
            ),
        )
        self._subscription = subscription
        self._loop = asyncio.create_task(self._consume(subscription), name="webhook-consumer")
        self._gauge = asyncio.create_task(self._report_pending(), name="webhook-pending")

    async def _report_pending(self) -> None:
        """The consumer's backlog as deckhands_consumer_pending{consumer="webhooks"}, like every
        worker's consumers (shared.health), for the dashboard and the pending-growing alert."""
        while True:
            await asyncio.sleep(CONSUMER_GAUGE_REFRESH_S)
            if not self._connected():
                continue  # the gauge keeps its last figure; deckhands_nats_connected says why
            try:
                async with asyncio.timeout(CONSUMER_GAUGE_REFRESH_S):
                    info = await self._jetstream().consumer_info(NOTICES_STREAM, DURABLE)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.debug("webhook consumer: its pending count is unknown: %s", exc)
                continue
            CONSUMER_PENDING.labels(NOTICES_STREAM, DURABLE).set(int(info.num_pending or 0))

    async def stop(self) -> None:
        for loop in (self._loop, self._gauge):
            if loop is not None:
                loop.cancel()
                with contextlib.suppress(BaseException):
                    await loop
        for running in list(self._running):
            running.cancel()
        if self._running:
            await asyncio.wait(self._running, timeout=5)
        if self._subscription is not None:
            # Gone before the connection drains: a pull subscription left to the drain holds
            # it until its last pull request expires. The durable consumer stays on the server.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._subscription.unsubscribe(), 2.0)
            self._subscription = None
        if self._http is not None:
            await self._http.aclose()

    async def _consume(self, subscription: JetStreamContext.PullSubscription) -> None:
        pause = 0.0
        while True:
            if pause:
                await asyncio.sleep(pause)
            if not self._connected():
                # NATS away: nothing is asked meanwhile (a pull request would only wait in the
                # client's buffer); the messages wait in the stream.
                pause = min(max(pause * 2, 0.5), 10.0)
                continue
            try:
                messages = await subscription.fetch(_FETCH_BATCH, timeout=5)
            except (nats.errors.TimeoutError, TimeoutError):
                pause = 0.0
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                pause = min(max(pause * 2, 0.5), 10.0)
                log.warning("webhook consumer: fetch failed (%s); again in %.1f s", exc, pause)
                continue
            pause = 0.0
            for msg in messages:
                try:
                    await self._take(msg)
                except Exception:
                    log.exception("webhook consumer: a message could not be handled")

    async def _take(self, msg: Msg) -> None:
        """Acknowledge what needs no notification; hand a notification to a delivery slot."""
        notice = _notice(msg.data)
        if notice is None:
            await msg.ack()
            return
        webhook = await self.webhooks.of_task(notice.task_id)
        if webhook is None or (
            notice.agent_state in WAITING_STATES and not webhook.spec.on_waiting
        ):
            await msg.ack()
            return
        await self._slots.acquire()
        task = asyncio.create_task(self._deliver_and_settle(msg, notice, webhook))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _deliver_and_settle(
        self, msg: Msg, notice: AgentStateChangedObservation, webhook: TaskWebhook
    ) -> None:
        try:
            delay = await self.deliver(notice, webhook)
            if delay is None:
                await msg.ack()
            else:
                await msg.nak(delay=delay)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Redis or NATS failed mid-way: the message comes back after ack_wait.
            log.exception("webhook of task %s: delivery interrupted", notice.task_id)
        finally:
            self._slots.release()

    async def deliver(
        self, notice: AgentStateChangedObservation, webhook: TaskWebhook
    ) -> float | None:
        """One attempt; the delay before the next one, or None when the notification is done
        (delivered, given up, or done before)."""
        delivery_id = notice.id
        known = await self.webhooks.delivery(delivery_id)
        if known is not None and known.done:
            return None  # delivered (or abandoned) before; its acknowledgement was lost
        record = await self.webhooks.begin_attempt(delivery_id)
        spec = webhook.spec
        started = time.monotonic()
        status: int | None = None
        error = ""
        final_error = False
        try:
            key = await self._signing_key(webhook)
            target = await self._target(spec.url)
            if isinstance(target, _Refused):
                error, final_error = f"target refused: {target.reason}", True
            elif isinstance(target, _LookupFailed):
                error = f"not sent: {target.reason}"  # nothing was sent; tried again later
            else:
                body = body_bytes(await self._payload(notice, delivery_id))
                status, error = await self._post(target, body, key, delivery_id, notice)
        except _Undeliverable as exc:
            error, final_error = str(exc), True
        duration_ms = (time.monotonic() - started) * 1000
        delivered = status is not None and 200 <= status < 300
        delay: float | None = None
        if delivered:
            outcome = "delivered"
        elif final_error or record.attempts >= self.policy.max_attempts:
            outcome = "gave_up"
        else:
            delay = self.policy.backoff(record.attempts)
            elapsed = time.time() - record.first_attempt_at
            outcome = "retrying" if elapsed + delay <= self.policy.deadline_s else "gave_up"
            if outcome == "gave_up":
                delay = None
        await self.webhooks.record(
            notice.task_id,
            DeliveryAttempt(
                delivery_id=delivery_id,
                event_type=event_type(notice.agent_state),
                url=spec.url,
                attempt=record.attempts,
                at=datetime.now(UTC),
                duration_ms=round(duration_ms, 1),
                status_code=status,
                error=error,
                outcome=outcome,  # type: ignore[arg-type]
                next_attempt_in_s=None if delay is None else round(delay, 3),
            ),
        )
        DELIVERIES.labels(outcome).inc()
        if outcome == "gave_up":
            log.warning(
                "webhook of task %s (%s) abandoned after %d attempts: %s",
                notice.task_id,
                event_type(notice.agent_state),
                record.attempts,
                error or f"HTTP {status}",
            )
        return delay

    async def _signing_key(self, webhook: TaskWebhook) -> bytes:
        name = webhook.spec.signing_secret
        if self.secrets is None:
            raise _Undeliverable("secrets are off on this server: nothing to sign with")
        try:
            return (await self.secrets.read(webhook.tenant_id, name)).encode()
        except SecretNotFound:
            raise _Undeliverable(f"the signing secret {name!r} no longer exists") from None
        except SecretUnreadable as exc:
            raise _Undeliverable(str(exc)) from None

    async def _target(self, url: str) -> WebhookTarget | _Refused | _LookupFailed:
        """The POST to make, or why the URL's host may not be reached (now). The name is
        resolved once, every address it has is checked (shared/address_policy.py), and the
        request goes to the one checked (its name kept in the Host header and, for https, in
        the TLS server name and certificate check): a name that resolves elsewhere a moment
        later (DNS rebinding) cannot redirect it. A lookup that fails is a failed attempt, tried
        again later: never a request that would let the HTTP client resolve the name itself."""
        if self.policy.allow_private:
            return WebhookTarget(url)
        parts = urlsplit(url)
        why = url_host_refused(url)
        if why is not None:
            return _Refused(why)
        port = parts.port or default_port(parts.scheme)
        try:
            async with asyncio.timeout(self.policy.timeout_s):
                address = await checked_address(parts.hostname or "", port, self._resolve)
        except HostRefused as exc:
            return _Refused(str(exc))
        except (LookupFailed, TimeoutError) as exc:
            return _LookupFailed(str(exc) or f"{parts.hostname}: the lookup timed out")
        return pinned_target(url, address)

    async def _payload(
        self, notice: AgentStateChangedObservation, delivery_id: str
    ) -> dict[str, Any]:
        state = await self.states.load(notice.task_id)
        record = await self.records.get(notice.task_id)
        task: dict[str, Any] = {
            "id": notice.task_id,
            "state": notice.agent_state.value,
            "reason": notice.reason,
            "labels": [] if record is None else list(record.labels),
        }
        if state is not None:
            task |= {
                "iterations": state.iterations_used(),
                "cost_usd": round(state.total_usage().cost_usd, 6),
                "created_at": state.created_at.isoformat(),
                "finished_at": None if state.finished_at is None else state.finished_at.isoformat(),
                "final_message": "" if state.result is None else state.result.final_message,
            }
        return {
            "id": delivery_id,
            "type": event_type(notice.agent_state),
            "occurred_at": notice.timestamp.isoformat(),
            "event_seq": notice.seq,
            "task": task,
        }

    async def _post(
        self,
        target: WebhookTarget,
        body: bytes,
        key: bytes,
        delivery_id: str,
        notice: AgentStateChangedObservation,
    ) -> tuple[int | None, str]:
        assert self._http is not None, "start() was not called"
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(key, body, int(time.time())),
            "Deckhands-Delivery-Id": delivery_id,
            "Deckhands-Event": event_type(notice.agent_state),
        }
        request = self._http.build_request(
            "POST",
            target.url,
            content=body,
            headers={**target.headers, **headers},
            extensions=target.extensions,
        )
        try:
            answer = await self._http.send(request)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:500]
        if 200 <= answer.status_code < 300:
            return answer.status_code, ""
        return answer.status_code, f"HTTP {answer.status_code}"


@dataclass(frozen=True)
class _Refused:
    reason: str


@dataclass(frozen=True)
class _LookupFailed:
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


class _Undeliverable(Exception):
    """No attempt can succeed (no signing key, a refused target): give up now."""


def _notice(data: bytes | None) -> AgentStateChangedObservation | None:
    """The state change a notification may be due for; None for anything else (parsed only
    when the bytes can be one)."""
    if not data or _MARKER not in data:
        return None
    try:
        event = EventAdapter.validate_json(data)
    except ValidationError:
        return None
    if isinstance(event, AgentStateChangedObservation) and event.agent_state in NOTIFIED_STATES:
        return event
    return None


def build_deliverer(
    settings: GatewaySettings, broker: NatsBroker, redis: Redis, context: GatewayContext
) -> WebhookDeliverer:
    assert context.attachments is not None
    return WebhookDeliverer(
        lambda: broker.connection.jetstream(),
        context.attachments.webhooks,
        context.secrets,
        context.tasks.store,
        context.tasks.records,
        DeliveryPolicy(
            timeout_s=settings.webhook_timeout_s,
            backoff_s=settings.webhook_backoff_s,
            backoff_max_s=settings.webhook_backoff_max_s,
            deadline_s=settings.webhook_deadline_s,
            max_attempts=settings.webhook_max_attempts,
            allow_private=settings.webhook_allow_private_targets,
            concurrency=settings.webhook_concurrency,
        ),
        lambda: broker.connection.is_connected,
    )
