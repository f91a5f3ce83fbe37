"""The States this replica saved last, so that a turn need not read its own write back.

Redis stays the only truth: a cached State is used only while Redis still holds its version
(`TaskStateStore.fresh`, in the round trip that would otherwise read the State), so a hit saves
the transfer and the parse, and a State another writer (another replica, the gateway) saved
since is read instead. Deployed with two controllers, a task's inputs come to the replica that
handled its previous one only by chance: a turn that started from the older cached State
decided on it (an answer it awaits looked stale), lost its compare-and-set, and was done again.
The compare-and-set save still refuses a State changed between the read and the write.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.state import TaskState

__all__ = ["StateCache"]


class StateCache:
    """At most `size` States, least recently used out first."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._states: OrderedDict[str, TaskState] = OrderedDict()

    def get(self, task_id: str) -> TaskState | None:
        state = self._states.get(task_id)
        if state is not None:
            self._states.move_to_end(task_id)
        return state

    def put(self, state: TaskState) -> None:
        if self.size <= 0:
            return
        self._states[state.task_id] = state
        self._states.move_to_end(state.task_id)
        while len(self._states) > self.size:
            self._states.popitem(last=False)

    def drop(self, task_id: str) -> None:
        self._states.pop(task_id, None)

    def __len__(self) -> int:
        return len(self._states)
