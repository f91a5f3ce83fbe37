"""Load State, apply one event, save with compare-and-set, then publish what was decided."""

from __future__ import annotations

import logging

from faststream.nats import NatsBroker
from prometheus_client import Counter, Histogram

from shared.delivery import PermanentError
from shared.events import Event, utc_now
from shared.publishing import publish_json
from shared.state import Outgoing
from shared.state_store import StateConflict, TaskStateStore

from .agent_loop import apply
from .turn import Turn

__all__ = ["ControllerHandlers"]

log = logging.getLogger("deckhands.controller")

CONFLICTS = Counter("deckhands_controller_cas_conflicts_total", "State writes lost to a replica")
REPLAYED = Counter(
    "deckhands_controller_redelivered_inputs_total", "Inputs recognised as already applied"
)
TURN_SECONDS = Histogram("deckhands_controller_turn_seconds", "Time to apply one input event")


class ControllerHandlers:
    def __init__(self, broker: NatsBroker, store: TaskStateStore, cas_attempts: int) -> None:
        self.broker = broker
        self.store = store
        self.cas_attempts = cas_attempts

    async def on_input(self, event: Event) -> None:
        with TURN_SECONDS.time():
            outbox = await self._decide(event)
        for message in outbox:
            await publish_json(
                self.broker, message.subject, message.payload, message.msg_id, message.stream
            )

    async def _decide(self, event: Event) -> list[Outgoing]:
        for _ in range(self.cas_attempts):
            state = await self.store.load(event.task_id)
            if state is None:
                raise PermanentError(f"unknown task {event.task_id}")
            if state.has_processed(event.id):
                # Applied before, but maybe not fully published: publish it again (the
                # Nats-Msg-Id of each message makes a second copy a no-op in JetStream).
                REPLAYED.inc()
                return state.outboxes.get(event.id, [])
            turn = Turn(state)
            apply(turn, event)
            for sub_task in turn.new_tasks:
                # Before the parent's save: a sub-task must exist before its first input.
                await self.store.create(sub_task)
            outbox = turn.outbox()
            turn.update(updated_at=utc_now(), **turn.state.record_input(event.id, outbox))
            try:
                await self.store.save(turn.state)
            except StateConflict:
                CONFLICTS.inc()
                continue
            return outbox
        raise RuntimeError(
            f"task {event.task_id}: state kept changing under {self.cas_attempts} tries"
        )
