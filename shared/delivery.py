"""At-least-once delivery with bounded retries and a dead-letter subject.

FastStream's NATS default terminates a failed message. deckhands subscribes with
AckPolicy.MANUAL and this middleware decides instead:

- success: ack;
- a message that cannot be parsed (garbage, wrong schema) or raises `PermanentError`:
  dead-letter at once, since redelivering cannot help;
- any other failure: nack with exponential backoff, and dead-letter once the message has
  been delivered `max_deliveries` times (never for `NotYet`: a message early, not broken).

A dead-lettered message keeps its original bytes (the first 256 KiB of a larger one, so the
copy always fits the server's max_payload); headers say where it came from and why. When the
message was a work order for a task, the task's controller is told (an AnswerMissingObservation
with why=dead_lettered, naming the order it waits for), so the task ends in ERROR with the
reason instead of waiting for ever. The service keeps running in every case.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from faststream import BaseMiddleware
from nats.aio.msg import Msg
from prometheus_client import Counter
from pydantic import ValidationError

from .events import AnswerMissingObservation, EventSource
from .outages import is_jetstream_outage
from .publishing import MAX_MSG_ID_BYTES, MessageTooLarge, publish_event_to
from .subjects import DLQ_STREAM, Service, dlq_subject

__all__ = ["DeliveryGuard", "NotYet", "PermanentError", "backoff_delay", "missing_answer_notice"]

log = logging.getLogger("deckhands.delivery")

DEAD_LETTERED = Counter(
    "deckhands_dead_lettered_total", "Messages sent to the dead-letter subject", ["service"]
)
REDELIVERIES = Counter(
    "deckhands_redeliveries_requested_total", "Messages nacked for redelivery", ["service"]
)


class PermanentError(Exception):
    """The message can never be processed; retrying it is pointless."""


class NotYet(Exception):
    """The message came before what it follows (an input for a task whose creation request is
    still queued): redelivered with backoff for as long as it takes, never dead-lettered for
    its number of deliveries. The handler decides it is only early, not lost."""


def backoff_delay(delivered: int, first_s: float, max_s: float) -> float:
    return min(max_s, first_s * (2.0 ** max(0, delivered - 1)))


_DLQ_BODY_MAX = 256 * 1024
_WORK_PREFIX = "deckhands.work."
_AWAITS = {"reasoner": "agent", "security": "security", "runtime": "runtime"}


def missing_answer_notice(
    subject: str, data: bytes, reason: str
) -> AnswerMissingObservation | None:
    """What to tell a task's controller about its dead-lettered work order, if anything."""
    parts = subject.split(".")
    if len(parts) != 4 or not subject.startswith(_WORK_PREFIX):
        return None
    service, task_id = parts[2], parts[3]
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    if service == "reasoner":
        awaited = body.get("id")
    elif service == "controller":
        # An answer the controller itself could not apply; never a notice about a notice.
        awaited = None if body.get("kind") == "answer_missing" else body.get("cause")
    else:
        action = body.get("action")
        awaited = action.get("id") if isinstance(action, dict) else None
    # No order of deckhands has an id that long: no task awaits it (and it could not be sent).
    if not isinstance(awaited, str) or not awaited or len(awaited) > MAX_MSG_ID_BYTES // 2:
        return None
    return AnswerMissingObservation(
        id=f"dlq-{service}-{awaited}",
        task_id=task_id,
        source=EventSource.SYSTEM,
        cause=awaited,
        why="dead_lettered",
        awaiting=_AWAITS.get(service, service),
        detail=f"the {service} service dead-lettered it: {reason}"[:2000],
    )


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return " ".join(text.split())[:1000]


class DeliveryGuard:
    """Middleware factory: `NatsBroker(middlewares=[DeliveryGuard(...)])`."""

    def __init__(
        self, service: Service, *, max_deliveries: int, backoff_s: float, backoff_max_s: float
    ) -> None:
        self.service = service
        self.max_deliveries = max_deliveries
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s

    def __call__(self, msg: Any, /, *, context: Any) -> _GuardMiddleware:
        return _GuardMiddleware(msg, context=context, guard=self)

    def is_permanent(self, exc: BaseException) -> bool:
        """A failure that redelivering cannot cure."""
        return isinstance(exc, _PERMANENT)

    async def settle_failure(self, broker: Any, raw: Msg, exc: BaseException) -> None:
        """One JetStream message whose processing failed: dead-letter it if it can never
        succeed or has used its deliveries, otherwise nack it with backoff."""
        delivered = raw.metadata.num_delivered
        # A stream without a leader for a moment is no reason to give up on a message.
        exhausted = (
            delivered >= self.max_deliveries
            and not is_jetstream_outage(exc)
            and not isinstance(exc, NotYet)
        )
        if self.is_permanent(exc) or exhausted:
            await self.dead_letter(broker, raw, exc, delivered)
            return
        delay = backoff_delay(delivered, self.backoff_s, self.backoff_max_s)
        log.warning(
            "%s: delivery %d of %s failed, retrying in %.1fs: %s",
            self.service,
            delivered,
            raw.subject,
            delay,
            _reason(exc),
        )
        REDELIVERIES.labels(self.service.value).inc()
        await raw.nak(delay=delay)

    async def dead_letter(self, broker: Any, raw: Msg, exc: BaseException, delivered: int) -> None:
        reason = _reason(exc)
        meta = raw.metadata
        headers = {
            "Nats-Msg-Id": f"dlq-{meta.stream}-{meta.sequence.stream}",
            "Deckhands-Dlq-Reason": reason,
            "Deckhands-Dlq-Subject": raw.subject,
            "Deckhands-Dlq-Stream": meta.stream,
            "Deckhands-Dlq-Stream-Seq": str(meta.sequence.stream),
            "Deckhands-Dlq-Deliveries": str(delivered),
            "Deckhands-Dlq-Service": self.service.value,
        }
        body = raw.data
        if len(body) > _DLQ_BODY_MAX:
            headers["Deckhands-Dlq-Truncated-From"] = str(len(body))
            body = body[:_DLQ_BODY_MAX]
        await broker.publish(body, dlq_subject(self.service), headers=headers, stream=DLQ_STREAM)
        notice = missing_answer_notice(raw.subject, raw.data, reason)
        if notice is not None:
            try:
                await publish_event_to(broker, Service.CONTROLLER, notice)
            except Exception as exc:
                # The dead letter is safe; failing here would leave the message unacknowledged,
                # to be redelivered and dead-lettered again for ever.
                log.warning(
                    "%s: could not tell task %s about its dead-lettered order: %s",
                    self.service,
                    notice.task_id,
                    _reason(exc),
                )
        log.error("%s: dead-lettered %s: %s", self.service, raw.subject, reason)
        DEAD_LETTERED.labels(self.service.value).inc()
        # The copy is safe in the DLQ stream; only now is the original let go.
        if not raw._ackd:
            await raw.ack()


_PERMANENT = (
    ValidationError,
    PermanentError,
    MessageTooLarge,
    json.JSONDecodeError,
    UnicodeDecodeError,
)


class _GuardMiddleware(BaseMiddleware):
    def __init__(self, msg: Any, /, *, context: Any, guard: DeliveryGuard) -> None:
        super().__init__(msg, context=context)
        self.guard = guard

    async def consume_scope(self, call_next: Any, msg: Any) -> Any:
        raw = msg.raw_message
        if not isinstance(raw, Msg) or not raw.reply or not raw.reply.startswith("$JS.ACK"):
            # Core NATS (request/reply): nothing to acknowledge. A batch (a list of messages)
            # is settled message by message by its handler, with `settle_failure`.
            return await call_next(msg)
        try:
            result = await call_next(msg)
        except Exception as exc:
            await self.guard.settle_failure(self.context.get("broker"), raw, exc)
            return None
        await msg.ack()
        return result
