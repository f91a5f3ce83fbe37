"""An ended task's sandbox, kept paused for its workspace.

When a task ends (FINISHED, STOPPED, REJECTED) its sandbox is paused instead of removed, its
files kept, its seat freed, for `workspace_retention_s` (the pool keeps at most
`workspace_retained_max`, the oldest going first); then it is removed and the workspace
answers 410. A message that resumes the task within that time finds its files and sessions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes

__all__ = ["KeptSandboxes", "Retention"]

log = logging.getLogger("deckhands.runtime.workspace")


class Retention:
    """Ended tasks whose sandbox is kept paused, and until when (a sorted set in Redis)."""

    def __init__(self, redis: Redis, pool_name: str) -> None:
        self.redis = redis
        self.key = f"deckhands:retained:{pool_name}"

    async def add(self, task_id: str, until: float) -> None:
        await self.redis.zadd(self.key, {task_id: until})

    async def until(self, task_id: str) -> float | None:
        score = await self.redis.zscore(self.key, task_id)
        return None if score is None else float(score)

    async def due(self, now: float) -> list[str]:
        raw = await self.redis.zrangebyscore(self.key, "-inf", now)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    async def all(self) -> list[str]:
        raw = await self.redis.zrange(self.key, 0, -1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    async def drop(self, task_id: str) -> None:
        await self.redis.zrem(self.key, task_id)

    async def oldest_beyond(self, keep: int) -> list[str]:
        """The tasks kept the longest, all but the `keep` newest (the score is the end of the
        retention, the same length for all: the oldest end first)."""
        raw = await self.redis.zrange(self.key, 0, -(keep + 1))
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


class KeptSandboxes:
    """The sandboxes of ended tasks this pool keeps: kept at a task's end, removed when their
    time is up, their task is deleted, or the pool keeps too many."""

    def __init__(
        self, retention: Retention, tasks: TaskSandboxes, settings: RuntimeSettings
    ) -> None:
        self.retention = retention
        self.tasks = tasks
        self.settings = settings
        # One eviction pass at a time: the releases of a crowd of ending tasks all ask for one,
        # and each would otherwise remove the same oldest sandboxes again (15 times over, seen).
        self._evicting = asyncio.Lock()

    async def retain(self, task_id: str) -> bool:
        """The task ended: keep its sandbox paused for the retention time. False if it is
        not kept (no retention, or no sandbox here to keep): the caller removes it."""
        s = self.settings
        if s.workspace_retention_s <= 0:
            return False
        # Recorded before the stop: reconciliation removes a stopped sandbox of an ended task
        # that is not kept.
        await self.retention.add(task_id, time.time() + s.workspace_retention_s)
        if not await self.tasks.retain(task_id):
            await self.retention.drop(task_id)
            return False
        log.info("task %s: sandbox kept paused for %.0fs", task_id, s.workspace_retention_s)
        return True

    async def is_retained(self, task_id: str) -> bool:
        until = await self.retention.until(task_id)
        return until is not None and until > time.time()

    async def evict_beyond_cap(self, is_over: Callable[[str], Awaitable[bool]]) -> int:
        """Remove the oldest kept sandboxes while the pool keeps more than
        `workspace_retained_max` (those on another live replica's engine are that replica's to
        remove: its own release or sweep does)."""
        cap = self.settings.workspace_retained_max
        evicted = 0
        async with self._evicting:
            for task_id in await self.retention.oldest_beyond(cap):
                if await self._end_retention(task_id, is_over):
                    evicted += 1
                    log.info(
                        "task %s: its kept sandbox is removed before its retention ends: the "
                        "pool keeps at most %d (DECKHANDS_WORKSPACE_RETAINED_MAX)",
                        task_id,
                        cap,
                    )
        return evicted

    async def _end_retention(
        self, task_id: str, ended: Callable[[str], Awaitable[bool]]
    ) -> bool | None:
        """The task's sandbox is no longer kept: removed if its task `ended` (True), or left to
        its own life if it runs again (False). None: it is on another live replica's engine,
        whose release or sweep does it."""
        if await self.tasks.held_elsewhere(task_id) is not None:
            return None
        removed = await ended(task_id)
        if removed:
            await self.tasks.release(task_id)
        await self.retention.drop(task_id)
        return removed

    async def sweep(
        self, is_over: Callable[[str], Awaitable[bool]], is_gone: Callable[[str], Awaitable[bool]]
    ) -> int:
        """Remove the kept sandboxes whose time is up or whose task was deleted, and the oldest
        beyond the pool's cap."""
        removed = await self.evict_beyond_cap(is_over)
        due = set(await self.retention.due(time.time()))

        async def ended(task_id: str) -> bool:
            return await is_over(task_id) or await is_gone(task_id)

        for task_id in await self.retention.all():
            if task_id not in due and not await is_gone(task_id):
                continue
            if await self._end_retention(task_id, ended):
                removed += 1
        return removed
