"""When an awaited answer is overdue (pure policy; the sweeper in handlers.py does the I/O).

Every answer the controller waits for from another service has a deadline, kept in the State
and indexed in Redis with it. A person's answer (input, confirmation) and a sub-task have none:
they may take as long as they take.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from shared.events import (
    ChangeAgentStateAction,
    EventBase,
    EventSource,
    SandboxQueuedObservation,
)
from shared.state import Awaiting, TaskState

from .settings import ControllerSettings

__all__ = ["AnswerDeadlines"]


@dataclass(frozen=True)
class AnswerDeadlines:
    agent_s: float
    security_s: float
    runtime_s: float
    queue_s: float = 3600.0

    @classmethod
    def from_settings(cls, settings: ControllerSettings) -> AnswerDeadlines:
        return cls(
            settings.agent_answer_deadline_s,
            settings.security_answer_deadline_s,
            settings.runtime_answer_deadline_s,
            settings.sandbox_queue_deadline_s,
        )

    def wait_s(self, state: TaskState) -> float | None:
        if state.awaiting is Awaiting.AGENT:
            return self.agent_s
        if state.awaiting is Awaiting.SECURITY:
            return self.security_s
        if state.awaiting is Awaiting.RUNTIME:
            # The action's own timeout counts on top: a long command is not a missing answer.
            own = getattr(state.pending_action, "timeout_s", None) or 0.0
            return self.runtime_s + own
        return None

    def deadline(self, state: TaskState, now: datetime) -> datetime | None:
        """When what `state` awaits is overdue, counted from `now` (None: no deadline)."""
        wait = self.wait_s(state)
        return None if wait is None else now + timedelta(seconds=wait)

    def rearm(
        self, before: TaskState, after: TaskState, event: EventBase, now: datetime
    ) -> dict[str, Any]:
        """Field updates for `after`: a new deadline whenever what it awaits changed, or a sign
        of life came for it (a rate-limit notice: the reasoner is still on it)."""
        waiting_for = (after.awaiting, after.awaiting_id, after.awaiting_attempt)
        changed = waiting_for != (before.awaiting, before.awaiting_id, before.awaiting_attempt)
        alive = (
            isinstance(event, ChangeAgentStateAction)
            and event.source is EventSource.SYSTEM
            and event.cause is not None
            and event.cause == after.awaiting_id
        )
        queued = (
            isinstance(event, SandboxQueuedObservation)
            and after.awaiting is Awaiting.RUNTIME
            and event.cause == after.awaiting_id
        )
        if queued:  # the runtime has the action and runs it once a seat frees
            return {"awaiting_deadline": now + timedelta(seconds=self.queue_s)}
        if not changed and not alive:
            return {}
        updates: dict[str, Any] = {}
        if (after.awaiting, after.awaiting_id) != (before.awaiting, before.awaiting_id) and (
            after.awaiting_attempt == before.awaiting_attempt
        ):
            updates["awaiting_attempt"] = 0  # a new question, not the old one asked again
        wait = self.wait_s(after)
        updates["awaiting_deadline"] = None if wait is None else now + timedelta(seconds=wait)
        return updates
