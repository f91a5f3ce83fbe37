"""The runtime runs only what was reviewed (issue 9, part 6).

Anyone who can publish to `deckhands.work.runtime.<task>` could otherwise have any command run
in a task's sandbox. Before an ExecuteAction reaches a sandbox, the runtime reads the task's
State (one Redis read, the one the runtime needs anyway) and runs the order only when:

- the task is RUNNING (not STOPPED, PAUSED, ended or waiting for a person);
- the State awaits the runtime's answer to this very action (its id), and the action is the
  one the controller reviewed, field for field (a forged order reusing the awaited id with
  another command is refused);
- the State holds the action's approval: the security monitor's ALLOW verdict or the user's
  confirmation, naming this action;
- the order asks for network egress exactly when the task does, and carries the task's own
  egress policy (a forged order must not widen where the sandbox may connect).

Anything else (forged, replayed, stale) is answered with an ErrorObservation (`order_refused`,
its cause the action's id) and a WARNING on the `deckhands.security` logger, and is never run:
no sandbox is started or touched for it. The controller takes the refusal as the action's answer
only when it awaits exactly that; otherwise it is a stale answer it ignores. An order for a task
with no State at all is dead-lettered (PermanentError) as before: there is no task to answer.
But when Redis lost every State (a FLUSHALL, a new Redis), the controller rebuilds them from the
tasks' logs: until it has, an order waits for its task's State, then is retried.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from shared.commands import ORDER_REFUSED, ExecuteAction
from shared.delivery import PermanentError
from shared.events import AgentState, ErrorObservation, EventBase, EventSource
from shared.state import Awaiting, TaskState
from shared.state_store import TaskStateStore

from .errors import StateBeingRebuilt
from .metrics import REFUSED

__all__ = ["OrderCheck", "refusal_of"]

security_log = logging.getLogger("deckhands.security")

_REBUILD_POLL_S = 0.25


def refusal_of(state: TaskState, order: ExecuteAction) -> tuple[str, str] | None:
    """Why `order` must not run, as (label, sentence); None when it is the reviewed action the
    task awaits. Pure: the caller reads the State."""
    action = order.action
    if state.agent_state is not AgentState.RUNNING:
        return "not_running", f"the task is {state.agent_state.value}"
    if state.awaiting is not Awaiting.RUNTIME or state.awaiting_id != action.id:
        awaited = f"{state.awaiting.value} {state.awaiting_id or ''}".strip()
        return "not_awaited", f"the task does not await this action (it awaits {awaited})"
    if state.pending_action != action:
        return "altered", "the action differs from the one that was reviewed"
    approval = state.approval
    if approval is None or approval.action_id != action.id:
        return "not_approved", "no ALLOW verdict or user confirmation approved this action"
    if order.network_egress != state.network_egress:
        return "egress_mismatch", "the order's network egress is not the task's"
    if order.network != state.network:
        return "egress_mismatch", "the order's egress policy is not the task's"
    return None


class OrderCheck:
    def __init__(
        self,
        states: TaskStateStore,
        publish: Callable[[EventBase], Awaitable[None]],
        rebuild_wait_s: float = 20.0,
    ):
        self.states = states
        self.publish = publish
        self.rebuild_wait_s = rebuild_wait_s

    async def _state_of(self, task_id: str) -> TaskState | None:
        """The task's State; when Redis lost it (the controller's marker is gone too), the one
        the controller rebuilds from the task's log, waited for a while. None: no such task."""
        state = await self.states.load(task_id)
        deadline = time.monotonic() + self.rebuild_wait_s
        while state is None and not await self.states.intact():
            if time.monotonic() > deadline:
                raise StateBeingRebuilt(f"task {task_id}: its State is not rebuilt yet")
            await asyncio.sleep(_REBUILD_POLL_S)
            state = await self.states.load(task_id)
        return state

    async def admit(self, order: ExecuteAction) -> bool:
        """Whether the order may run; a refused one is answered and logged here."""
        action = order.action
        state = await self._state_of(order.task_id)
        if state is None:
            REFUSED.labels("unknown_task").inc()
            security_log.warning(
                "runtime refused order %s: action %s for unknown task %s",
                order.id,
                action.id,
                order.task_id,
            )
            raise PermanentError(f"unknown task {order.task_id}: no sandbox is started for it")
        refusal = refusal_of(state, order)
        if refusal is None:
            return True
        why, sentence = refusal
        REFUSED.labels(why).inc()
        security_log.warning(
            "runtime refused order %s: %s %s of task %s was not run: %s (%s)",
            order.id,
            action.kind,
            action.id,
            order.task_id,
            sentence,
            why,
        )
        await self.publish(
            ErrorObservation(
                # One answer per order, however often it is delivered.
                id=f"refused-{order.id}",
                task_id=order.task_id,
                source=EventSource.ENVIRONMENT,
                cause=action.id,
                error_code=ORDER_REFUSED,
                content=f"The runtime refused to run this action: {sentence}. It was not run.",
            )
        )
        return False
