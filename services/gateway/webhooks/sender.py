"""One delivery attempt of a webhook notification: signed, sent to a checked address, recorded."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx

from shared.address_policy import (
    HostRefused,
    LookupFailed,
    Resolver,
    checked_address,
    default_port,
    url_host_refused,
)
from shared.events import AgentStateChangedObservation
from shared.secrets_store import SecretNotFound, SecretsStore, SecretUnreadable
from shared.state_store import TaskStateStore

from ..metrics import DELIVERIES
from ..tasks.records import TaskRecords
from .models import DeliveryAttempt
from .notifications import SIGNATURE_HEADER, body_bytes, event_type, sign
from .policy import DeliveryPolicy
from .store import TaskWebhook, WebhookStore
from .targets import TargetLookupFailed, TargetRefused, WebhookTarget, pinned_target

__all__ = ["WebhookSender"]

log = logging.getLogger("deckhands.gateway.webhooks")


class WebhookSender:
    """One attempt at a notification: the signing key read, the target checked and pinned, the
    signed POST, the attempt recorded. The base of WebhookDeliverer, which holds what it uses."""

    webhooks: WebhookStore
    secrets: SecretsStore | None
    states: TaskStateStore
    records: TaskRecords
    policy: DeliveryPolicy
    _resolve: Resolver
    _http: httpx.AsyncClient | None

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
            if isinstance(target, TargetRefused):
                error, final_error = f"target refused: {target.reason}", True
            elif isinstance(target, TargetLookupFailed):
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

    async def _target(self, url: str) -> WebhookTarget | TargetRefused | TargetLookupFailed:
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
            return TargetRefused(why)
        port = parts.port or default_port(parts.scheme)
        try:
            async with asyncio.timeout(self.policy.timeout_s):
                address = await checked_address(parts.hostname or "", port, self._resolve)
        except HostRefused as exc:
            return TargetRefused(str(exc))
        except (LookupFailed, TimeoutError) as exc:
            return TargetLookupFailed(str(exc) or f"{parts.hostname}: the lookup timed out")
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


class _Undeliverable(Exception):
    """No attempt can succeed (no signing key, a refused target): give up now."""
