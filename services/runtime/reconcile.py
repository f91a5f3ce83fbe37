"""Reconciliation: make what runs on Docker agree with what the runtime knows.

Run at start-up and periodically. For each container labelled as this pool's sandbox:
- tracked by this replica (idle, busy, or being created): keep;
- bound to a task in Redis: removed if its task is over, or if it stopped without being
  stopped on purpose while its task waited (the task's next action then reports the lost
  workspace); adopted if its creator is gone and its holding replica is this one or gone too
  (the binding then names this replica), else left to its owner;
- named for a task but not bound (Redis lost the binding): bound again if the task is live;
- otherwise a warm sandbox. Removed if its creator is this replica (a leak), a replica that
  no longer sends heartbeats, or if it has not been running long after its creation; left
  alone while its creator lives.
Bindings whose task is over are dropped with their container, workspace keepers whose sandbox is
gone or running again are removed, and workspace volumes that no container uses any more are
pruned.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .bindings import TaskBindings
from .containers import (
    LABEL_REPLICA,
    TASK_PREFIX,
    ContainerInfo,
    DockerSandboxes,
    task_container_name,
)
from .errors import SandboxStartError
from .metrics import SANDBOXES_REMOVED
from .pool import WarmPool
from .sandbox_labels import LABEL_EGRESS
from .task_sandboxes import TaskSandboxes

__all__ = ["ReconcileReport", "reconcile"]

log = logging.getLogger("deckhands.runtime.reconcile")


@dataclass
class ReconcileReport:
    removed: int = 0
    adopted: int = 0
    kept: int = 0
    unbound: int = 0
    volumes_pruned: int = 0
    keepers_removed: int = 0
    rebound: int = 0
    egress_folders_removed: int = 0


class _Pass:
    """One reconciliation pass: its report, and what it learnt of other replicas."""

    def __init__(
        self,
        docker: DockerSandboxes,
        bindings: TaskBindings,
        tasks: TaskSandboxes,
        replica_id: str,
        task_is_over: Callable[[str], Awaitable[bool]],
    ) -> None:
        self.docker = docker
        self.bindings = bindings
        self.tasks = tasks
        self.replica_id = replica_id
        self.task_is_over = task_is_over
        self.report = ReconcileReport()
        self._alive: dict[str, bool] = {}

    async def creator_alive(self, replica: str) -> bool:
        if replica == self.replica_id:
            return True
        if replica not in self._alive:
            self._alive[replica] = await self.bindings.replica_alive(replica)
        return self._alive[replica]

    async def remove(self, cid: str, reason: str) -> None:
        await self.docker.remove(cid)
        SANDBOXES_REMOVED.labels(reason).inc()
        self.report.removed += 1

    async def bound(self, info: ContainerInfo, task_id: str, holder: str | None) -> None:
        """A container bound to `task_id` in Redis (held by replica `holder`)."""
        docker, bindings, report = self.docker, self.bindings, self.report
        creator = info.labels.get(LABEL_REPLICA, "")
        if await self.task_is_over(task_id):
            # Unbound first, as a release does: a workspace read meanwhile answers that the
            # sandbox is gone (410), not that its files are missing. Should the removal fail,
            # the unbound container is an orphan the next pass removes.
            await bindings.unbind(task_id, info.id)
            await self.remove(info.id, "task_over")
            report.unbound += 1
        elif not info.running:
            if await bindings.stopped_at(info.id) is None and await _still_down(docker, info.id):
                await self.remove(info.id, "dead")  # the binding stays: the task hears it was lost
            else:  # stopped while its task waits (its next action starts it), or started
                report.kept += 1
        elif (
            self.tasks.local(task_id) is None
            and not await self.creator_alive(creator)
            and await _ours_to_take(bindings, holder)
        ):
            try:
                sandbox = await docker.attach(info.id, info.name)
            except SandboxStartError as exc:
                log.warning("cannot adopt %s of task %s: %s", info.id[:12], task_id, exc)
                await self.remove(info.id, "dead")
            else:
                sandbox.task_id = task_id
                self.tasks.adopt(task_id, sandbox)
                await bindings.rehold(task_id, info.id)
                report.adopted += 1
        else:
            report.kept += 1


async def reconcile(
    docker: DockerSandboxes,
    bindings: TaskBindings,
    pool: WarmPool,
    tasks: TaskSandboxes,
    replica_id: str,
    task_is_over: Callable[[str], Awaitable[bool]],
    task_is_live: Callable[[str], Awaitable[bool]],
) -> ReconcileReport:
    run = _Pass(docker, bindings, tasks, replica_id, task_is_over)
    report = run.report
    stuck_after_s = docker.settings.start_timeout_s * 2
    # Bindings first, containers second: a sandbox is bound only once it runs, so a binding
    # seen here names a container the list below sees in its bound state (taken the other way
    # round, a sandbox another replica started and bound meanwhile would look bound and dead).
    held = await bindings.all_held()
    containers = await docker.list(everything=True)
    bound = {task: cid for task, (cid, _) in held.items()}
    task_of = {cid: task for task, cid in bound.items()}
    holder_of = {cid: holder for cid, holder in held.values()}

    for info in containers:
        # Asked now, not from a snapshot taken before the awaits above: a sandbox whose start
        # finished meanwhile is the pool's, not an orphan.
        if pool.knows(info.id) or info.name in docker.pending_names:
            report.kept += 1
            continue
        task_id = task_of.get(info.id)
        creator = info.labels.get(LABEL_REPLICA, "")
        if task_id is not None:
            await run.bound(info, task_id, holder_of.get(info.id))
        elif info.task_name is not None and await _rebind(info, bindings, task_is_live):
            report.rebound += 1
        elif (
            creator == replica_id
            or not await run.creator_alive(creator)
            # Not yet started is normal for a moment (its creator is starting it); for long, not.
            or (not info.running and info.age_s > stuck_after_s)
        ):
            await run.remove(info.id, "orphan")
        else:
            report.kept += 1

    # Bindings of tasks that are over, whose container is already gone.
    present = {c.id for c in containers}
    for task_id, cid in bound.items():
        if cid not in present and await task_is_over(task_id):
            await bindings.unbind(task_id, cid)
            report.unbound += 1
    # Before the volumes: a keeper no longer needed must not hold one.
    report.keepers_removed = await docker.remove_stray_keepers()
    report.volumes_pruned = await docker.prune_volumes()
    # Egress folders of sandboxes gone (a crash between a removal and its folder's).
    live = {c.labels[LABEL_EGRESS] for c in containers if LABEL_EGRESS in c.labels}
    report.egress_folders_removed = await docker.egress_folders.sweep(live)
    if (
        report.removed
        or report.adopted
        or report.unbound
        or report.volumes_pruned
        or report.keepers_removed
        or report.egress_folders_removed
    ):
        log.info("reconciled: %s", report)
    return report


async def _still_down(docker: DockerSandboxes, container_id: str) -> bool:
    """Not running now either: the list is a moment old, and meanwhile another replica may
    have started the sandbox again (a stopped one whose task came back)."""
    info = await docker.inspect(container_id)
    return info is not None and not info.running


async def _ours_to_take(bindings: TaskBindings, holder: str | None) -> bool:
    """A task sandbox whose creator is gone is adopted by a replica of its holder's name (a
    restarted one), or by any once that name is gone too (an engine shared by replicas)."""
    return holder is None or holder == bindings.replica or not await bindings.name_alive(holder)


async def _rebind(
    info: ContainerInfo, bindings: TaskBindings, task_is_live: Callable[[str], Awaitable[bool]]
) -> bool:
    """A running `deckhands-task-<id>` container whose binding Redis lost: bind it again if
    its task is known and still going (names of hashed ids cannot be traced back)."""
    task_id = (info.task_name or "")[len(TASK_PREFIX) :]
    if not info.running or task_container_name(task_id) != info.name:
        return False
    if not await task_is_live(task_id):
        return False
    return await bindings.bind(task_id, info.id) == info.id


async def reconcile_quietly(run: Callable[[], Awaitable[ReconcileReport]]) -> None:
    try:
        await run()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("reconciliation failed")
