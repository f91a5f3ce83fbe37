"""Facts about a task that the gateway writes once, before the task's first message, and never
changes: its repository and its secret grant. The runtime reads them before every action; kept
here once seen, they cost one Redis read per task instead of one per action.

"The task has none" is kept only for a short while: a Redis that lost its data says so until
the gateway has filled it again from the durable records.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["TaskFacts"]

T = TypeVar("T")

_MAX_TASKS = 20_000
_ABSENT_TTL_S = 10.0


class TaskFacts(Generic[T]):
    def __init__(
        self,
        read: Callable[[str], Awaitable[T | None]],
        max_tasks: int = _MAX_TASKS,
        absent_ttl_s: float = _ABSENT_TTL_S,
    ) -> None:
        self._read = read
        self._max_tasks = max_tasks
        self._absent_ttl_s = absent_ttl_s
        # task id -> (the fact or None, until when a None holds)
        self._known: OrderedDict[str, tuple[T | None, float]] = OrderedDict()

    async def get(self, task_id: str) -> T | None:
        known = self._known.get(task_id)
        if known is not None:
            fact, until = known
            if fact is not None or time.monotonic() < until:
                self._known.move_to_end(task_id)
                return fact
        fact = await self._read(task_id)
        self._known[task_id] = (fact, time.monotonic() + self._absent_ttl_s)
        self._known.move_to_end(task_id)
        if len(self._known) > self._max_tasks:
            self._known.popitem(last=False)
        return fact

    def forget(self, task_id: str) -> None:
        self._known.pop(task_id, None)
