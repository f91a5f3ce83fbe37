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
from collections.abc import Callable

import httpx
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import ValidationError

from shared.address_policy import Resolver, system_resolver
from shared.events import AgentStateChangedObservation, EventAdapter
from shared.health import CONSUMER_GAUGE_REFRESH_S, CONSUMER_PENDING
from shared.secrets_store import SecretsStore
from shared.state_store import TaskStateStore
from shared.subjects import NOTICES_STREAM, notice_subject

from ..tasks.records import TaskRecords
from .notifications import NOTIFIED_STATES, WAITING_STATES
from .policy import DeliveryPolicy
from .sender import WebhookSender
from .store import TaskWebhook, WebhookStore

__all__ = ["DURABLE", "WebhookDeliverer"]

log = logging.getLogger("deckhands.gateway.webhooks")

DURABLE = "webhooks"
_ACK_WAIT_S = 60.0
_FETCH_BATCH = 64
_MARKER = b'"agent_state_changed"'


class WebhookDeliverer(WebhookSender):
    """The consumer `webhooks`: each notification due handed to a delivery slot (WebhookSender
    makes the attempt), acknowledged once the attempt is recorded."""

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
