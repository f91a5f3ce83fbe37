"""What every part of the controller's policy uses: the error codes it logs, counting, the
stuck detector's memory, and refusing an input."""

from __future__ import annotations

import logging

from prometheus_client import Counter

from shared.events import ErrorObservation, EventBase, EventSource

from ..stuck import SIGNATURES_KEPT, signature
from ..turn import Turn

__all__ = [
    "CONTROLLER_ERROR_CODES",
    "DELEGATION_REFUSED",
    "ILLEGAL_TRANSITION",
    "SECURITY_DENIED",
    "count",
    "log",
    "refuse",
    "remember",
]

log = logging.getLogger("deckhands.controller")

# The error codes of the ErrorObservations the controller itself logs (the other services'
# errors come to it as inputs): a rebuild tells the two apart by them.
ILLEGAL_TRANSITION = "illegal_transition"
DELEGATION_REFUSED = "delegation_refused"
SECURITY_DENIED = "security_denied"
CONTROLLER_ERROR_CODES = frozenset({ILLEGAL_TRANSITION, DELEGATION_REFUSED, SECURITY_DENIED})


def count(turn: Turn, counter: Counter) -> None:
    """Count what the turn did, unless it is a replay of the log (a rebuild): that was counted
    when it happened."""
    if not turn.replaying:
        counter.inc()


def remember(turn: Turn, event: EventBase) -> None:
    sig = signature(event)
    if sig is not None:
        turn.update(recent=[*turn.state.recent, sig][-SIGNATURES_KEPT:])


def refuse(turn: Turn, event: EventBase, reason: str) -> None:
    turn.log(
        ErrorObservation(
            task_id=event.task_id,
            source=EventSource.ENVIRONMENT,
            cause=event.id,
            content=f"Refused: {reason}.",
            error_code=ILLEGAL_TRANSITION,
        )
    )
