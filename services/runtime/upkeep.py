"""The runtime's background work: heartbeats, and the upkeep the pool runs between its checks.

Upkeep stops the sandboxes of tasks that wait and ran nothing for a while, frees the seats of
tasks that ended while their release was lost, removes the kept sandboxes whose time is up,
re-adopts this replica's sandboxes when Redis lost its records, and reconciles what runs on
Docker with what Redis says (reconcile.py).
"""

from __future__ import annotations

import asyncio
import logging

from shared.admission import SandboxSeats
from shared.commands import ReleaseSandbox
from shared.events import AgentState
from shared.state import Awaiting

from .bindings import TaskBindings
from .containers import DockerSandboxes
from .errors import HeldElsewhere
from .pool import WarmPool
from .reconcile import ReconcileReport, reconcile, reconcile_quietly
from .retention import KeptSandboxes
from .seating import Seating
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_status import TaskStatus
from .workspace_ops import RuntimeWorkspace

__all__ = ["Upkeep"]

log = logging.getLogger("deckhands.runtime")

_WAITING_FOR_USER = frozenset(
    {
        AgentState.AWAITING_USER_INPUT,
        AgentState.AWAITING_USER_CONFIRMATION,
        AgentState.PAUSED,
        AgentState.ERROR,
    }
)


class Upkeep:
    def __init__(
        self,
        settings: RuntimeSettings,
        replica_id: str,
        docker: DockerSandboxes,
        pool: WarmPool,
        tasks: TaskSandboxes,
        bindings: TaskBindings,
        seats: SandboxSeats,
        status: TaskStatus,
        seating: Seating,
        kept: KeptSandboxes,
        workspace: RuntimeWorkspace,
    ) -> None:
        self.settings = settings
        self.replica_id = replica_id
        self.docker = docker
        self.pool = pool
        self.tasks = tasks
        self.bindings = bindings
        self.seats = seats
        self.status = status
        self.seating = seating
        self.kept = kept
        self.workspace = workspace

    # -- heartbeats

    async def send_heartbeats(self) -> None:
        ttl_s = self.settings.replica_ttl_s
        await self.bindings.heartbeat(self.replica_id, ttl_s)
        await self.bindings.name_heartbeat(ttl_s)

    async def beat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.replica_ttl_s / 3)
            try:
                await self.send_heartbeats()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    # -- the pool's periodic upkeep

    async def run(self) -> None:
        await reconcile_quietly(self.reconcile)
        try:
            await self.stop_idle_sandboxes()
        except Exception:
            log.exception("stopping idle sandboxes failed")
        try:
            await self.free_stale_seats()
        except Exception:
            log.exception("freeing the seats of ended tasks failed")
        try:
            await self.kept.sweep(self.status.is_over, self.status.is_gone)
            await self.workspace.remove_leftovers()
        except Exception:
            log.exception("removing the kept sandboxes of ended tasks failed")

    async def stop_idle_sandboxes(self) -> int:
        """Stop the sandboxes of tasks that wait (for a person, or, while others queue for a
        seat, for a sub-task) and ran nothing for a while; their seats go to the queue."""
        s = self.settings
        _, queued = await self.seats.counts()
        idle_s = s.sandbox_idle_stop_s
        if queued:
            idle_s = min(idle_s or s.queue_preempt_after_s, s.queue_preempt_after_s)
        if idle_s is None:
            return 0
        stopped = 0
        for task_id in self.tasks.idle_since(idle_s):
            state = await self.status.state(task_id)
            if state is None:
                continue
            # Only while the task waits for a person (or a sub-task): then no action can be on
            # its way.
            waits = state.agent_state in _WAITING_FOR_USER or (
                queued and state.awaiting is Awaiting.DELEGATE
            )
            if waits and await self.tasks.stop_idle(task_id, idle_s):
                stopped += 1
                await self.seats.release(task_id)
        if stopped:
            await self.seating.admit_queued()
        return stopped

    async def free_stale_seats(self) -> int:
        """Seats of tasks that ended (or vanished) while their release was lost (a crash):
        release them as the task's end would, the sandbox first, so that the seat is never
        free while the sandbox still runs."""
        freed = 0
        for task_id in await self.seats.seated():
            if await self.status.is_over(task_id) or await self.status.is_gone(task_id):
                try:
                    await self.seating.release(
                        ReleaseSandbox(task_id=task_id, reason="ended; seat freed")
                    )
                except HeldElsewhere:
                    continue  # its holder, alive, frees it
                freed += 1
        if freed:
            log.info("released %d seats of tasks that ended", freed)
        return freed

    async def readopt_after_redis_loss(self) -> int:
        """When Redis lost what it held (a FLUSHALL, a new Redis: this replica's marker is
        gone), bind this replica's task sandboxes again and hold their seats: their tasks keep
        their workspaces, and new tasks are admitted only into the seats that are left.

        Other replicas do the same for theirs; a task sandbox nobody holds in memory (its
        replica restarted meanwhile) is bound again by reconciliation, by its name, once the
        controller has rebuilt its task's State. What Redis held for queued tasks is gone: the
        controller sends their order again when it rebuilds their State."""
        marker = self.bindings.marker(self.replica_id)
        if await marker.intact():
            return 0
        token = await marker.begin_pass()
        # Alive again first: another replica must not take the sandboxes bound again below for
        # a gone replica's.
        await self.send_heartbeats()
        readopted = 0
        for task_id, sandbox in self.tasks.tasks().items():
            if sandbox.lost:
                continue
            if await self.bindings.bind(task_id, sandbox.container_id) == sandbox.container_id:
                await self.seats.hold(task_id, await self.status.tenant_of(task_id))
                readopted += 1
        await marker.end_pass(token)  # unless Redis lost them again meanwhile: then again
        log.warning("Redis lost the runtime's records: %d task sandboxes bound again", readopted)
        return readopted

    # -- reconciliation

    async def reconcile(self) -> ReconcileReport:
        return await reconcile(
            self.docker,
            self.bindings,
            self.pool,
            self.tasks,
            self.replica_id,
            self._over_and_not_kept,
            self.status.is_live,
        )

    async def _over_and_not_kept(self, task_id: str) -> bool:
        """Over, and its sandbox not kept for its workspace (retention.py)."""
        return await self.status.is_over(task_id) and not await self.kept.is_retained(task_id)
