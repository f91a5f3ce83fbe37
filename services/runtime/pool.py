"""The warm pool: ready sandboxes waiting for tasks, scaled by load.

- It keeps a target number of idle sandboxes (pool_scaling.py): `pool_min_idle`, plus the
  demand expected during one cold start, within `pool_max_idle` and `pool_max_total`.
- Every start, the pool's own and its callers', waits for a fair slot (sandbox_starts.py).
- A sandbox is handed out only after its executor answered a ping just now; a dead one is
  removed and the next is tried. When none is idle, the caller's own sandbox is started on
  demand (a miss) and the pool refills in the background; at `pool_max_total` it waits.
- A sandbox handed out is never taken back: `discard` destroys it, and the pool replaces it.
- Warm sandboxes have no network. A task that opted in to egress gets a sandbox started for it
  on its network (a cold start: keeping warm networked sandboxes would give every pooled
  container a network it might never need).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

from shared.sandbox_protocol.session import answers
from shared.waiting import wait_up_to

from .containers import IDLE_PREFIX, LABEL_REPLICA, DockerSandboxes, Sandbox
from .errors import PoolExhausted, SandboxStartError
from .let_go import RecentlyLetGo
from .metrics import (
    ACQUIRE_SECONDS,
    ACQUISITIONS,
    COLD_START_SECONDS,
    POOL_HITS,
    POOL_MISSES,
    POOL_TARGET_IDLE,
    SANDBOXES,
    SANDBOXES_LOST,
    SANDBOXES_REMOVED,
)
from .pool_scaling import idle_target, refills_due
from .sandbox_shape import POOL_SHAPE, SandboxShape
from .sandbox_starts import ANYONE, REFILL, StartGate, StartTerms
from .settings import RuntimeSettings

__all__ = ["WarmPool"]

log = logging.getLogger("deckhands.runtime.pool")


class WarmPool:
    def __init__(self, settings: RuntimeSettings, docker: DockerSandboxes) -> None:
        self.settings = settings
        self.docker = docker
        self._idle: deque[Sandbox] = deque()
        self._busy: dict[str, Sandbox] = {}
        self._let_go = RecentlyLetGo()  # sandboxes let go of for removal: see let_go
        self._creating, self._refilling = 0, 0  # starts; of them, the pool's own (refills)
        self._starts = StartGate(settings.sandbox_start_concurrency)
        self._waiting, self.queued_demand = 0, 0  # acquisitions waiting; see expect_queued
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._acquired_at: deque[float] = deque()
        self._cold_starts: deque[float] = deque(maxlen=20)
        self._surplus_since: float | None = None
        self._refill_failures = 0
        self._background: set[asyncio.Task[None]] = set()
        self._maintainer: asyncio.Task[None] | None = None
        self.periodic: Callable[[], Awaitable[None]] | None = None  # e.g. reconcile
        self._closed = False

    # -- numbers

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def creating(self) -> int:
        return self._creating

    @property
    def total(self) -> int:
        return self.idle + self.busy + self.creating

    def knows(self, container_id: str) -> bool:
        """Whether this pool holds the container (idle or handed out), or let go of it lately
        to remove it."""
        return (
            container_id in self._busy
            or container_id in self._let_go
            or any(s.container_id == container_id for s in self._idle)
        )

    def let_go(self, container_id: str) -> None:
        """The container is being removed (its task lost it or ended). Reconciliation, working
        from a list that may be older than the removal, must not take it (named for its task,
        unbound) for one whose binding Redis lost and bind it again."""
        self._let_go.add(container_id)

    def expect_queued(self, tasks: int) -> None:
        """`tasks` wait for a seat while every seat is taken: each will want a sandbox when a
        seat frees, so up to that many more are kept warm (within pool_max_idle)."""
        grew = tasks > self.queued_demand
        self.queued_demand = tasks
        if grew:
            self._wake.set()

    def target_idle(self) -> int:
        """Idle sandboxes to keep: the floor, plus the demand expected during one cold start
        (pool_scaling.py)."""
        return idle_target(
            self.settings,
            self._acquired_at,
            self._cold_starts,
            # A caller starting a sandbox of its own waits for nothing in the pool.
            waiting=max(0, self._waiting - (self._creating - self._refilling)),
            queued=self.queued_demand,
            busy=self.busy,
        )

    def _publish_gauges(self) -> None:
        SANDBOXES.labels("idle").set(self.idle)
        SANDBOXES.labels("busy").set(self.busy)
        SANDBOXES.labels("creating").set(self.creating)

    # -- life cycle

    def start(self) -> None:
        if self._maintainer is None:
            self._wake.set()  # fill the pool now, not after the first upkeep interval
            self._maintainer = asyncio.create_task(self._maintain(), name="pool-maintainer")

    async def stop(self) -> None:
        """Stop refilling and remove idle sandboxes; busy ones stay for a successor to adopt."""
        self._closed = True
        if self._maintainer is not None:
            self._maintainer.cancel()
            await asyncio.wait({self._maintainer}, timeout=10)
        # Sandboxes being started are let finish (then removed), so none is left behind.
        pending = list(self._background)
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.settings.start_timeout_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        idle = list(self._idle)
        self._idle.clear()
        await asyncio.gather(*(self._destroy(s, "shutdown") for s in idle))
        task_sandboxes = set(self._busy)
        for sandbox in self._busy.values():
            await sandbox.session.close()
        self._busy.clear()
        await self.docker.drain(self.settings.start_timeout_s)
        # A creation nobody awaits here (a caller that gave up) may still be finishing:
        # let every in-flight start end before the final sweep, so none is left behind.
        deadline = time.monotonic() + self.settings.start_timeout_s
        while self.docker.pending_names and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        await self.docker.drain(self.settings.start_timeout_s)
        await self._sweep_unbound(keep=task_sandboxes)
        self._publish_gauges()

    async def _sweep_unbound(self, keep: set[str]) -> None:
        """Remove this replica's never-bound containers that a failed start left behind."""
        for info in await self.docker.list():
            ours = info.labels.get(LABEL_REPLICA) == self.docker.replica_id
            if ours and info.name.startswith(IDLE_PREFIX) and info.id not in keep:
                log.warning(
                    "removing unbound sandbox %s (%s) at shutdown", info.id[:12], info.status
                )
                await self.docker.remove(info.id)

    # -- acquisition

    async def acquire(
        self, shape: SandboxShape = POOL_SHAPE, *, terms: StartTerms = ANYONE
    ) -> Sandbox:
        """A ready sandbox, used by nobody before; it now counts as busy.

        A sandbox of a task's own `shape` (sandbox_shape.py) is started for the caller.
        `terms`: whose start it is (sandbox_starts.py), and the warm sandboxes the caller
        leaves to others (the rest of a burst leaves the pool's last ones to whoever comes
        next); it takes one only beyond
        them, or at the pool's maximum, where nothing else can start.
        """
        dedicated = shape.own(self.docker.pool_network)
        started = time.monotonic()
        deadline = started + self.settings.acquire_timeout_s
        # Demand for warm sandboxes: a dedicated one never comes from the pool.
        demand = 0 if dedicated else 1
        if demand:
            self._acquired_at.append(started)
        self._wake.set()
        self._waiting += demand
        try:
            while True:
                at_max = self.total >= self.settings.pool_max_total
                leave = 0 if at_max else terms.leave_idle
                sandbox = None if dedicated else await self._take_idle(leave)
                if sandbox is not None:
                    POOL_HITS.inc()
                    break
                if self.total < self.settings.pool_max_total:
                    if not dedicated:
                        POOL_MISSES.inc()
                    sandbox = await self._create(terms, shape)
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PoolExhausted(
                        f"no sandbox became free within {self.settings.acquire_timeout_s:g}s "
                        f"(pool at its maximum of {self.settings.pool_max_total})"
                    )
                async with self._changed:
                    await wait_up_to(min(remaining, 1.0), self._changed.wait())
        finally:
            self._waiting -= demand
        ACQUISITIONS.inc()
        ACQUIRE_SECONDS.observe(time.monotonic() - started)
        self._wake.set()
        self._publish_gauges()
        return sandbox

    async def _take_idle(self, leave: int = 0) -> Sandbox | None:
        while len(self._idle) > leave:
            sandbox = self._idle.popleft()
            # Counted busy while checked, so nobody else can take it or count it twice.
            self._busy[sandbox.container_id] = sandbox
            if not sandbox.lost and await answers(sandbox.session, 2.0):
                return sandbox
            SANDBOXES_LOST.labels("idle").inc()
            log.warning("idle sandbox %s failed its health check", sandbox.short_id)
            self._busy.pop(sandbox.container_id, None)
            self._spawn(self._destroy(sandbox, "unhealthy"))
        return None

    async def _create(self, terms: StartTerms, shape: SandboxShape = POOL_SHAPE) -> Sandbox:
        """A sandbox started when `terms` get a start slot: a caller's, counted busy at once,
        or the pool's own (REFILL), for the caller to make idle."""
        self._creating += 1
        self._publish_gauges()
        try:
            async with self._starts.slot(terms):
                started = time.monotonic()
                sandbox = await self.docker.create(shape)
        finally:
            self._creating -= 1
        elapsed = time.monotonic() - started
        self._cold_starts.append(elapsed)
        COLD_START_SECONDS.observe(elapsed)
        if terms is not REFILL:
            self._busy[sandbox.container_id] = sandbox
        return sandbox

    def adopt(self, sandbox: Sandbox) -> None:
        """Count an existing task sandbox (found after a restart or bound elsewhere) as busy."""
        self._busy[sandbox.container_id] = sandbox
        self._publish_gauges()

    def put_back(self, sandbox: Sandbox) -> None:
        """Return a sandbox that was acquired but never used (its task went elsewhere)."""
        self._busy.pop(sandbox.container_id, None)
        if sandbox.shape.own(self.docker.pool_network):
            # Made for one task (its network, its workspace size): of no use to the pool.
            self._spawn(self._destroy(sandbox, "unused"))
        elif self._closed:
            self._spawn(self._destroy(sandbox, "shutdown"))
        else:
            self._idle.appendleft(sandbox)
        self._notify()

    async def discard(self, container_id: str, reason: str) -> None:
        """Destroy a busy sandbox (its task ended or it died; let go of first, see let_go); the
        pool replaces it."""
        sandbox = self._busy.pop(container_id, None)
        if sandbox is not None:
            await self._destroy(sandbox, reason)
        else:
            await self.docker.remove(container_id)
            SANDBOXES_REMOVED.labels(reason).inc()
        self._notify()

    def forget(self, container_id: str) -> Sandbox | None:
        """Stop tracking a busy sandbox without removing it (another replica removed it)."""
        sandbox = self._busy.pop(container_id, None)
        self._notify()
        return sandbox

    async def _destroy(self, sandbox: Sandbox, reason: str) -> None:
        await sandbox.session.close()
        await self.docker.remove(sandbox.container_id)
        SANDBOXES_REMOVED.labels(reason).inc()

    def _notify(self) -> None:
        self._publish_gauges()
        self._wake.set()

        async def _notify_waiters() -> None:
            async with self._changed:
                self._changed.notify_all()

        self._spawn(_notify_waiters())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- background upkeep

    async def _maintain(self) -> None:
        last_check = time.monotonic()
        while True:
            await wait_up_to(self._next_wait(), self._wake.wait())
            self._wake.clear()
            try:
                self._refill()
                await self._shrink()
                if time.monotonic() - last_check >= self.settings.pool_health_interval_s:
                    last_check = time.monotonic()
                    await self._check_idle()
                    if self.periodic is not None:
                        await self.periodic()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("pool upkeep failed")

    def _next_wait(self) -> float:
        if self._refill_failures:
            return min(30.0, 0.5 * 2.0**self._refill_failures)
        return min(self.settings.pool_health_interval_s, 5.0)

    def _refill(self) -> None:
        target = self.target_idle()
        POOL_TARGET_IDLE.set(target)
        for _ in range(refills_due(self.settings, target, self.idle, self._refilling, self.total)):
            self._refilling += 1
            self._spawn(self._refill_one())

    async def _refill_one(self) -> None:
        try:
            sandbox = await self._create(REFILL)
        except SandboxStartError as exc:
            self._refill_failures += 1
            log.error("could not start a warm sandbox (attempt %d): %s", self._refill_failures, exc)
            self._publish_gauges()
            return
        finally:
            self._refilling -= 1
        self._refill_failures = 0
        if self._closed:
            await self._destroy(sandbox, "shutdown")
            return
        self._idle.append(sandbox)
        self._notify()

    async def _shrink(self) -> None:
        target = self.target_idle()
        if self.idle <= target:
            self._surplus_since = None
            return
        now = time.monotonic()
        if self._surplus_since is None:
            self._surplus_since = now
        if now - self._surplus_since < self.settings.pool_scale_down_after_s:
            return
        surplus = [self._idle.pop() for _ in range(self.idle - target)]  # newest first
        self._surplus_since = None
        log.info("scaling down: removing %d idle sandboxes", len(surplus))
        await asyncio.gather(*(self._destroy(s, "scale_down") for s in surplus))
        self._publish_gauges()

    async def _check_idle(self) -> None:
        # Busy sandboxes whose stream ended (removed by another replica, or dead): stop counting
        # them. Their task hears of the loss on its next action.
        for cid, sandbox in list(self._busy.items()):
            if sandbox.lost:
                self._busy.pop(cid, None)
                SANDBOXES_LOST.labels("busy").inc()
                await self._destroy(sandbox, "lost")
        for sandbox in list(self._idle):
            if sandbox.lost or not await answers(sandbox.session, 2.0):
                with contextlib.suppress(ValueError):
                    self._idle.remove(sandbox)
                    SANDBOXES_LOST.labels("idle").inc()
                    await self._destroy(sandbox, "unhealthy")
        self._publish_gauges()
