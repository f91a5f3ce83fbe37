"""Turns a ReviewAction into a ReviewedAction (the action and its verdict) for the controller.

The reasoner sends each runnable action here on its way to the controller, so one message
brings the controller both; a review the controller asks for again is answered the same way.
"""

from __future__ import annotations

import uuid

from faststream.nats import NatsBroker

from shared.commands import ReviewAction
from shared.events import EventSource, ReviewedAction, SecurityVerdictObservation
from shared.publishing import publish_event_to
from shared.subjects import Service

from .metrics import VERDICTS
from .network_scope import network_scope
from .rules import review

__all__ = ["SecurityHandlers", "reviewed", "verdict_for"]

_VERDICT_NS = uuid.UUID("8f5b7f0e-3c1a-4c39-9d0e-4a3e59d0b1a7")
_REVIEWED_NS = uuid.UUID("2c0d9a4e-61b7-4f0a-8e3d-5b9c7a1f2e64")


def verdict_for(request: ReviewAction, workspace: str) -> SecurityVerdictObservation:
    finding = review(request.action, workspace)
    return SecurityVerdictObservation(
        # Derived from the request so a redelivered review publishes the same event id.
        id=uuid.uuid5(_VERDICT_NS, request.id).hex,
        task_id=request.task_id,
        source=EventSource.ENVIRONMENT,
        cause=request.action.id,
        verdict=finding.verdict,
        risk=finding.risk,
        rule=finding.rule,
        reason=finding.reason,
        network_scope=network_scope(request.action),
    )


def reviewed(request: ReviewAction, verdict: SecurityVerdictObservation) -> ReviewedAction:
    return ReviewedAction(
        id=uuid.uuid5(_REVIEWED_NS, request.id).hex,
        task_id=request.task_id,
        source=EventSource.ENVIRONMENT,
        cause=request.action.cause,
        action=request.action,
        verdict=verdict,
    )


class SecurityHandlers:
    def __init__(self, broker: NatsBroker, workspace: str) -> None:
        self.broker = broker
        self.workspace = workspace

    async def on_review(self, request: ReviewAction) -> None:
        verdict = verdict_for(request, self.workspace)
        VERDICTS.labels(verdict.verdict.value, verdict.risk.value, verdict.rule or "").inc()
        await publish_event_to(self.broker, Service.CONTROLLER, reviewed(request, verdict))
