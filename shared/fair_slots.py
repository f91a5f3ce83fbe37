"""Slots shared fairly between tenants within one process: a semaphore whose freed slot goes to
the waiting tenant served least (by weight) since it began to wait, an interactive caller
before its tenant's batch ones, and arrival order after that.

A plain semaphore serves its waiters first come first served: when one tenant's batch of 300
tasks asks for the LLM at once, a quiet tenant's call waits behind all of them. Here it waits
only for the next free slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from .events import TaskPriority

__all__ = ["FairSlots"]


@dataclass
class _Waiters:
    interactive: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)
    batch: deque[tuple[int, asyncio.Future[None]]] = field(default_factory=deque)

    def queue(self, priority: TaskPriority) -> deque[tuple[int, asyncio.Future[None]]]:
        return self.interactive if priority is TaskPriority.INTERACTIVE else self.batch

    def first(self) -> deque[tuple[int, asyncio.Future[None]]] | None:
        """The queue whose head goes next: interactive ones first."""
        for queue in (self.interactive, self.batch):
            while queue and queue[0][1].done():  # cancelled while waiting
                queue.popleft()
            if queue:
                return queue
        return None


class FairSlots:
    """At most `size` holders at once across every tenant.

    Start-time fair queuing: each waiting tenant has a pass, advanced by 1/weight at each slot
    it is given; a freed slot goes to the lowest pass. A tenant that begins to wait starts at
    the pass of the last slot given, so that slots taken while nobody waited (an idle tenant's
    share, used by the others) are not held against anyone."""

    def __init__(self, size: int, weight: Callable[[str], float] | None = None) -> None:
        if size < 1:
            raise ValueError("FairSlots needs at least one slot")
        self.size = size
        self._weight = weight or (lambda _tenant: 1.0)
        self._held: dict[str, int] = {}
        self._waiting: dict[str, _Waiters] = {}
        self._free = size
        self._arrivals = itertools.count()
        self._pass: dict[str, float] = {}
        self._now = 0.0  # the pass of the last slot given to a waiter

    @property
    def free(self) -> int:
        return self._free

    def held_by(self, tenant: str) -> int:
        return self._held.get(tenant, 0)

    @contextlib.asynccontextmanager
    async def slot(
        self, tenant: str, priority: TaskPriority = TaskPriority.INTERACTIVE
    ) -> AsyncIterator[None]:
        await self._acquire(tenant, priority)
        try:
            yield
        finally:
            self._release(tenant)

    async def _acquire(self, tenant: str, priority: TaskPriority) -> None:
        if self._free > 0 and not self._waiting:
            self._take(tenant)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if tenant not in self._waiting:
            self._pass[tenant] = max(self._pass.get(tenant, 0.0), self._now)
        waiters = self._waiting.setdefault(tenant, _Waiters())
        waiters.queue(priority).append((next(self._arrivals), waiter))
        self._grant()  # a slot may be free behind waiters that were cancelled
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(tenant)  # granted as it was cancelled: pass the slot on
            raise
        finally:
            self._forget_empty(tenant)

    def _take(self, tenant: str) -> None:
        self._free -= 1
        self._held[tenant] = self._held.get(tenant, 0) + 1

    def _release(self, tenant: str) -> None:
        held = self._held.get(tenant, 0) - 1
        if held > 0:
            self._held[tenant] = held
        else:
            self._held.pop(tenant, None)
        self._free += 1
        self._grant()

    def _grant(self) -> None:
        while self._free > 0:
            chosen: tuple[float, int, str] | None = None
            for tenant, waiters in list(self._waiting.items()):
                queue = waiters.first()
                if queue is None:
                    del self._waiting[tenant]
                    continue
                key = (self._pass[tenant], queue[0][0], tenant)
                if chosen is None or key < chosen:
                    chosen = key
            if chosen is None:
                return
            tenant = chosen[2]
            queue = self._waiting[tenant].first()
            assert queue is not None
            _, waiter = queue.popleft()
            self._now = self._pass[tenant]
            weight = self._weight(tenant)
            self._pass[tenant] += 1.0 / (weight if weight > 0 else 1.0)
            self._take(tenant)
            waiter.set_result(None)

    def _forget_empty(self, tenant: str) -> None:
        waiters = self._waiting.get(tenant)
        if waiters is not None and waiters.first() is None:
            del self._waiting[tenant]
        if tenant not in self._waiting and self._pass.get(tenant, 0.0) <= self._now:
            self._pass.pop(tenant, None)  # it would start at the present pass anyway
