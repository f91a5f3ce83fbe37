"""Whether a task is live, over or gone, and whose it is: how the runtime reads the controller's
State (order_check.py reads it too, for the one question of whether an order may run).

One place to change when the State's ownership is settled (issue 26, D5): the runtime only reads
it, the controller writes it.
"""

from __future__ import annotations

from shared.events import SANDBOX_ENDING_STATES
from shared.state import TaskState
from shared.state_store import TaskStateStore

__all__ = ["TaskStatus"]


class TaskStatus:
    def __init__(self, states: TaskStateStore) -> None:
        self.states = states

    async def state(self, task_id: str) -> TaskState | None:
        """The task's State as the controller saved it; None when there is none."""
        return await self.states.load(task_id)

    async def is_live(self, task_id: str) -> bool:
        try:
            state = await self.states.load(task_id)
        except Exception:
            return False
        return state is not None and state.agent_state not in SANDBOX_ENDING_STATES

    async def is_over(self, task_id: str) -> bool:
        try:
            state = await self.states.load(task_id)
        except Exception:  # an unreadable state is not proof that the task ended
            return False
        return state is not None and state.agent_state in SANDBOX_ENDING_STATES

    async def is_gone(self, task_id: str) -> bool:
        """The task has no State, and not because Redis lost it: while the controller has not
        rebuilt the States of a Redis that lost them, a missing one proves nothing."""
        if await self.states.load(task_id) is not None:
            return False
        return await self.states.intact()

    async def tenant_of(self, task_id: str) -> str | None:
        """Whose share a seat held by the task counts against (None: unknown yet)."""
        try:
            state = await self.states.load(task_id)
        except Exception:  # an unreadable State: counted as nobody's, still counted
            return None
        return None if state is None else state.tenant_id
