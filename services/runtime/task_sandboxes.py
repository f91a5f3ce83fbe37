"""Which sandbox each task uses, across actions, replicas and restarts.

A task's first action takes a sandbox from the warm pool and binds it in Redis (SET NX), then
renames the container `deckhands-task-<task>`. Later actions find it in this replica's cache, or
through the binding (another replica, or before a restart, attached to it: we attach too). A
bound sandbox that is gone means the task's workspace is lost: the caller reports it, the binding
is dropped, and the task's next action gets a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .bindings import TaskBindings
from .containers import (
    LABEL_NETWORK,
    NO_NETWORK,
    ContainerInfo,
    DockerSandboxes,
    Sandbox,
    SandboxStartError,
    task_container_name,
)
from .metrics import SANDBOXES_LOST
from .pool import WarmPool

__all__ = ["TaskSandboxes", "WorkspaceLost", "describe_loss"]

log = logging.getLogger("deckhands.runtime.tasks")

_TOUCH_EVERY_S = 3600.0


class WorkspaceLost(Exception):
    """The task's sandbox died or vanished; its files and sessions are gone."""


class TaskSandboxes:
    def __init__(self, pool: WarmPool, docker: DockerSandboxes, bindings: TaskBindings) -> None:
        self.pool = pool
        self.docker = docker
        self.bindings = bindings
        self._local: dict[str, Sandbox] = {}
        self._touched: dict[str, float] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._renames: dict[str, asyncio.Task[None]] = {}

    def _lock(self, task_id: str) -> asyncio.Lock:
        lock = self._locks.get(task_id)
        if lock is None:
            lock = self._locks[task_id] = asyncio.Lock()
        return lock

    def local(self, task_id: str) -> Sandbox | None:
        return self._local.get(task_id)

    def tasks(self) -> dict[str, Sandbox]:
        return dict(self._local)

    async def get(self, task_id: str, network: str | None = None) -> Sandbox:
        """The task's sandbox, acquiring and binding one on its first action.

        `network` names the network of a task that opted in to egress; the sandbox is chosen
        on the first action, so it holds for the task's whole life.
        Raises WorkspaceLost when the task had a sandbox that no longer works.
        """
        async with self._lock(task_id):
            sandbox = self._local.get(task_id)
            if sandbox is not None and not sandbox.lost:
                await self._touch(task_id)
                return sandbox
            if sandbox is not None:  # it died since the last action
                self._local.pop(task_id, None)
                SANDBOXES_LOST.labels("between_actions").inc()
                await self._drop(task_id, sandbox.container_id, "lost")
                why = await self._why(sandbox.container_id, sandbox.client.lost_reason)
                raise WorkspaceLost(why)
            bound = await self.bindings.get(task_id)
            if bound is not None:
                return await self._attach_bound(task_id, bound)
            return await self._bind_fresh(task_id, network)

    async def _bind_fresh(self, task_id: str, network: str | None) -> Sandbox:
        sandbox = await self.pool.acquire(network)
        winner = await self.bindings.bind(task_id, sandbox.container_id)
        if winner != sandbox.container_id:
            # Another replica bound this task at the same moment: ours was never used.
            self.pool.put_back(sandbox)
            return await self._attach_bound(task_id, winner)
        sandbox.task_id = task_id
        self._local[task_id] = sandbox
        self._touched[task_id] = time.monotonic()
        # The name is for people and for adoption when Redis lost the binding; renaming takes
        # tens of milliseconds, so the task's first action does not wait for it.
        self._renames[task_id] = asyncio.create_task(self._rename(sandbox, task_id))
        return sandbox

    async def _rename(self, sandbox: Sandbox, task_id: str) -> None:
        name = task_container_name(task_id)
        try:
            await self.docker.rename(sandbox.container_id, name)
            sandbox.name = name
        except Exception as exc:  # the Redis binding is what counts
            log.warning("could not rename %s to %s: %s", sandbox.short_id, name, exc)

    async def renamed(self, task_id: str) -> None:
        """Wait until the task's sandbox carries its task name (if a rename is under way)."""
        task = self._renames.pop(task_id, None)
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)

    async def _attach_bound(self, task_id: str, container_id: str) -> Sandbox:
        info = await self.docker.inspect(container_id)
        if info is not None and info.running:
            try:
                sandbox = await self.docker.attach(container_id, info.name)
            except SandboxStartError as exc:
                reason = str(exc)
            else:
                sandbox.task_id = task_id
                sandbox.network = info.labels.get(LABEL_NETWORK, NO_NETWORK)
                self._local[task_id] = sandbox
                self.pool.adopt(sandbox)
                await self._touch(task_id, force=True)
                log.info("task %s: adopted sandbox %s", task_id, sandbox.short_id)
                return sandbox
        else:
            reason = describe_loss(info, None)
        SANDBOXES_LOST.labels("bound").inc()
        await self._drop(task_id, container_id, "lost")
        raise WorkspaceLost(reason)

    async def lost(self, task_id: str, sandbox: Sandbox) -> str:
        """The sandbox died during an action: forget it and say why."""
        async with self._lock(task_id):
            if self._local.get(task_id) is sandbox:
                self._local.pop(task_id, None)
            # The attach stream may end a moment before Docker records the exit and its cause.
            info = await self.docker.inspect(sandbox.container_id)
            for _ in range(10):
                if info is None or not info.running:
                    break
                await asyncio.sleep(0.1)
                info = await self.docker.inspect(sandbox.container_id)
            reason = describe_loss(info, sandbox.client.lost_reason)
            SANDBOXES_LOST.labels("during_action").inc()
            await self._drop(task_id, sandbox.container_id, "lost")
            return reason

    async def release(self, task_id: str) -> bool:
        """Destroy the task's sandbox (the task ended). False if it had none."""
        await self.renamed(task_id)
        async with self._lock(task_id):
            sandbox = self._local.pop(task_id, None)
            self._touched.pop(task_id, None)
            ids = {sandbox.container_id} if sandbox is not None else set()
            bound = await self.bindings.get(task_id)
            if bound is not None:
                ids.add(bound)
            named = await self.docker.inspect(task_container_name(task_id))
            if named is not None:
                ids.add(named.id)
            for cid in ids:
                await self._drop(task_id, cid, "released")
        self._locks.pop(task_id, None)
        return bool(ids)

    def adopt(self, task_id: str, sandbox: Sandbox) -> None:
        """Take over a running task sandbox found by reconciliation."""
        sandbox.task_id = task_id
        self._local[task_id] = sandbox
        self.pool.adopt(sandbox)

    def forget_local(self, task_id: str) -> None:
        """Drop the cached sandbox without removing it (e.g. at shutdown)."""
        self._local.pop(task_id, None)

    async def _drop(self, task_id: str, container_id: str, reason: str) -> None:
        # Unbind first: once the container is gone nobody may find it through the binding,
        # and a crash in between leaves an unbound container that reconcile removes.
        await self.bindings.unbind(task_id, container_id)
        await self.pool.discard(container_id, reason)

    async def _touch(self, task_id: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._touched.get(task_id, 0.0) > _TOUCH_EVERY_S:
            self._touched[task_id] = now
            await self.bindings.touch(task_id)

    async def _why(self, container_id: str, lost_reason: str | None) -> str:
        return describe_loss(await self.docker.inspect(container_id), lost_reason)


def describe_loss(info: ContainerInfo | None, lost_reason: str | None) -> str:
    """Why a sandbox is gone, in words an agent can act on."""
    if info is None:
        return "its container no longer exists"
    if info.oom_killed:
        return "its container was killed for exceeding the memory limit"
    if not info.running:
        return f"its container stopped ({info.status}, exit code {info.exit_code})"
    return lost_reason or "its executor stopped answering"
