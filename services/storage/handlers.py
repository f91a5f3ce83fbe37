"""Persist each logged event; answer history queries."""

from __future__ import annotations

import json
import logging

from nats.aio.msg import Msg
from pydantic import ValidationError

from shared.commands import ForgetTaskReply, ForgetTaskRequest, HistoryReply, HistoryRequest
from shared.delivery import DeliveryGuard, PermanentError
from shared.events import Event, EventAdapter

from .event_log import EventLog
from .metrics import DUPLICATES, HISTORY_ERRORS, STORED

__all__ = ["StorageHandlers"]

log = logging.getLogger("deckhands.storage")

# Room in a reply for its envelope (task id, last seq, the JSON list) and its headers.
_REPLY_ENVELOPE_BYTES = 16 * 1024


class StorageHandlers:
    def __init__(self, log: EventLog, max_reply_bytes: int) -> None:
        self.log = log
        self.max_reply_bytes = max_reply_bytes

    async def on_events(self, raws: list[Msg], guard: DeliveryGuard, broker: object) -> None:
        """A batch of logged events: all rows in one commit group, then each message settled
        on its own (acked, or nacked / dead-lettered by the guard's policy), so one bad event
        never holds back or drops the others."""
        kept: list[tuple[Msg, Event]] = []
        for raw in raws:
            try:
                kept.append((raw, _logged_event(raw.data)))
            except Exception as exc:
                await guard.settle_failure(broker, raw, exc)
        # The controller's bytes are stored as they are: they are the event's JSON already.
        outcomes = await self.log.append_many(
            [(e.task_id, e.seq or 0, e.id, e.kind, raw.data.decode()) for raw, e in kept]
        )
        for (raw, event), outcome in zip(kept, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, Exception):
                    raise outcome
                await guard.settle_failure(broker, raw, outcome)
                continue
            (STORED.labels(event.kind) if outcome else DUPLICATES).inc()
            await raw.ack()

    async def on_history(self, body: bytes) -> HistoryReply:
        """Every request gets a reply: the page, or an error naming what was wrong. The raw
        body is parsed here, so that a malformed request is answered rather than dropped."""
        try:
            request = HistoryRequest.model_validate_json(body)
        except ValidationError as exc:
            HISTORY_ERRORS.labels("bad_request").inc()
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "body"
            return HistoryReply(
                task_id=_task_of(body),
                events=[],
                last_seq=0,
                error=f"bad history request: {where}: {first.get('msg')}",
            )
        budget = min(request.max_bytes, self.max_reply_bytes - _REPLY_ENVELOPE_BYTES)
        try:
            page = await self.log.read(request.task_id, request.after, request.limit, budget)
        except Exception as exc:  # the disk or the database: the caller learns it at once
            HISTORY_ERRORS.labels("storage").inc()
            log.exception("history of task %s after %d failed", request.task_id, request.after)
            return HistoryReply(
                task_id=request.task_id,
                events=[],
                last_seq=0,
                error=f"storage failed to read the history: {type(exc).__name__}",
            )
        return HistoryReply(task_id=request.task_id, events=page.events, last_seq=page.last_seq)

    async def on_deletion(self, request: ForgetTaskRequest) -> None:
        """A deleted task, from the deletions stream: each replica's durable consumer gets it,
        one that was down when the gateway asked (on_forget) once it is back. Failing, it is
        retried by the delivery guard."""
        removed = await self.log.forget(request.task_id)
        log.info(
            "task %s deleted: %d stored events removed (deletions stream)", request.task_id, removed
        )

    async def on_forget(self, request: ForgetTaskRequest) -> ForgetTaskReply:
        """Every replica removes its copy of a deleted task's events."""
        try:
            removed = await self.log.forget(request.task_id)
        except Exception as exc:
            log.exception("removing the events of task %s failed", request.task_id)
            return ForgetTaskReply(
                task_id=request.task_id, error=f"storage failed: {type(exc).__name__}"
            )
        log.info("task %s deleted: %d stored events removed", request.task_id, removed)
        return ForgetTaskReply(task_id=request.task_id, removed=removed)


def _logged_event(data: bytes) -> Event:
    event = EventAdapter.validate_json(data)
    if event.seq is None:
        raise PermanentError(f"event {event.id} has no seq: only the controller logs events")
    return event


def _task_of(body: bytes) -> str:
    try:
        task_id = json.loads(body).get("task_id")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return ""
    return task_id if isinstance(task_id, str) else ""
