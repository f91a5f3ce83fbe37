"""Which sandbox each task uses, across actions, replicas and restarts.

A task's first action takes a sandbox from the warm pool and binds it in Redis (SET NX), then
renames the container `deckhands-task-<task>`. Later actions find it in this replica's cache, or
through the binding (another replica, or before a restart, attached to it: we attach too). A
bound sandbox that is gone means the task's workspace is lost: the caller reports it, the binding
is dropped, and the task's next action gets a fresh sandbox.

A sandbox whose task waits for the user may be stopped (`stop_idle`): it keeps its binding and
its /workspace volume, and a marker in Redis says it was stopped on purpose. The task's next
action starts it again, and the agent is told that its shell and Python session are new.

The sandbox of a task that ended is kept paused instead (`retain`), under the same marker: a
pause is tens of milliseconds of the engine's time where a stop and a keeper are a container
start and a stop, and hundreds of tasks end at once in a crowd. Its processes hold their memory
until the sandbox goes (the pool keeps a bounded number: DECKHANDS_WORKSPACE_RETAINED_MAX); a
message that resumes the task unpauses it, shell and Python session as they were.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

import docker

from .bindings import TaskBindings
from .containers import (
    LABEL_NETWORK,
    NO_NETWORK,
    ContainerInfo,
    DockerSandboxes,
    Sandbox,
    task_container_name,
)
from .errors import HeldElsewhere, SandboxStartError, WorkspaceLost
from .metrics import SANDBOXES_IDLE_STOPPED, SANDBOXES_LOST, SANDBOXES_RESTARTED
from .pool import WarmPool
from .sandbox_labels import LABEL_EGRESS
from .sandbox_shape import POOL_SHAPE, SandboxShape
from .sandbox_starts import ANYONE, StartTerms

__all__ = ["TaskSandboxes", "describe_loss"]

log = logging.getLogger("deckhands.runtime.tasks")

_TOUCH_EVERY_S = 3600.0


class TaskSandboxes:
    def __init__(self, pool: WarmPool, docker: DockerSandboxes, bindings: TaskBindings) -> None:
        self.pool = pool
        self.docker = docker
        self.bindings = bindings
        self._local: dict[str, Sandbox] = {}
        self._touched: dict[str, float] = {}
        self._used: dict[str, float] = {}  # task -> when it last asked for its sandbox
        self._locks: dict[str, asyncio.Lock] = {}
        self._renames: dict[str, asyncio.Task[None]] = {}
        # Told each time a task's sandbox was looked for beyond this replica's memory (bound,
        # started, or failed): the seats count it as starting until then.
        self.on_settled: Callable[[str], Awaitable[None]] | None = None
        # Whose a task's first sandbox start is, and how many warm sandboxes it leaves in the
        # pool (seating.py).
        self.start_terms: Callable[[str], Awaitable[StartTerms]] | None = None

    def _lock(self, task_id: str) -> asyncio.Lock:
        lock = self._locks.get(task_id)
        if lock is None:
            lock = self._locks[task_id] = asyncio.Lock()
        return lock

    def local(self, task_id: str) -> Sandbox | None:
        return self._local.get(task_id)

    def tasks(self) -> dict[str, Sandbox]:
        return dict(self._local)

    async def get(self, task_id: str, shape: SandboxShape = POOL_SHAPE) -> Sandbox:
        """The task's sandbox, acquiring and binding one on its first action.

        `shape`: its network and /workspace quota (sandbox_shape.py); the sandbox is chosen on
        the first action, so they hold for the task's whole life.
        Raises WorkspaceLost when the task had a sandbox that no longer works.
        """
        async with self._lock(task_id):
            self._used[task_id] = time.monotonic()
            sandbox = self._local.get(task_id)
            if sandbox is not None and not sandbox.lost:
                await self._touch(task_id)
                return sandbox
            if sandbox is not None:  # it died since the last action
                self._local.pop(task_id, None)
                SANDBOXES_LOST.labels("between_actions").inc()
                # Why, before the container is removed: then only "no longer exists" is left.
                why = await self._why(sandbox.container_id, sandbox.session.lost_reason)
                await self._drop(task_id, sandbox.container_id, "lost")
                raise WorkspaceLost(why)
            try:
                held = await self.bindings.held(task_id)
                if held is not None:
                    await self._check_holder(task_id, held[1])
                    return await self._attach_bound(task_id, held[0])
                return await self._bind_fresh(task_id, shape)
            finally:
                if self.on_settled is not None:
                    await self.on_settled(task_id)

    async def held_elsewhere(self, task_id: str) -> str | None:
        """The other replica, alive, that holds the task's sandbox; None if this one may use
        it (it holds it, nobody does, or its holder is gone)."""
        if self._local.get(task_id) is not None:
            return None
        holder = await self.bindings.holder(task_id)
        if holder is None or holder == self.bindings.replica:
            return None
        return holder if await self.bindings.name_alive(holder) else None

    async def _check_holder(self, task_id: str, holder: str | None) -> None:
        """A sandbox held by another live replica is on its engine: not ours to attach to (on
        another engine it would look lost). One whose holder is gone is ours to take."""
        if holder is None or holder == self.bindings.replica:
            return
        if await self.bindings.name_alive(holder):
            raise HeldElsewhere(task_id, holder)
        log.warning("task %s: runtime replica %s, which held its sandbox, is gone", task_id, holder)

    async def _bind_fresh(self, task_id: str, shape: SandboxShape) -> Sandbox:
        terms = ANYONE if self.start_terms is None else await self.start_terms(task_id)
        sandbox = await self.pool.acquire(shape, terms=terms)
        winner, holder = await self.bindings.bind_held(task_id, sandbox.container_id)
        if winner != sandbox.container_id:
            # Another replica bound this task at the same moment: ours was never used.
            self.pool.put_back(sandbox)
            await self._check_holder(task_id, holder)
            return await self._attach_bound(task_id, winner)
        sandbox.task_id = task_id
        sandbox.fresh = True
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
        stopped_at = None
        unpaused = False
        if info is not None and not info.running:
            stopped_at = await self.bindings.stopped_at(container_id)
            if stopped_at is not None and info.paused:
                unpaused = True
                info = await self._unpause(container_id)
            elif stopped_at is not None:
                info = await self._restart(container_id)
        if info is not None and info.running:
            try:
                sandbox = await self.docker.attach(
                    container_id, info.name, timeout_s=self.docker.settings.start_timeout_s
                )
            except SandboxStartError as exc:
                # The engine's words name containers and its address: the log keeps them.
                log.warning("task %s: sandbox %s not reattached: %s", task_id, container_id, exc)
                reason = "its sandbox could not be reattached"
            else:
                sandbox.task_id = task_id
                sandbox.network = info.labels.get(LABEL_NETWORK, NO_NETWORK)
                sandbox.egress_token = info.labels.get(LABEL_EGRESS)
                if sandbox.egress_token:  # removed with the sandbox, as if made here
                    self.docker.egress_tokens[container_id] = sandbox.egress_token
                self._local[task_id] = sandbox
                self.pool.adopt(sandbox)
                # Its orders come here from now on (the engine is shared with its old holder).
                await self.bindings.rehold(task_id, container_id)
                await self._touch(task_id, force=True)
                if stopped_at is not None:
                    await self.bindings.clear_stopped(container_id)
                if unpaused:
                    log.info("task %s: unpaused its kept sandbox %s", task_id, sandbox.short_id)
                elif stopped_at is not None:
                    sandbox.notice = _restarted_notice(time.time() - stopped_at)
                    SANDBOXES_RESTARTED.inc()
                    log.info("task %s: started stopped sandbox %s again", task_id, sandbox.short_id)
                else:
                    log.info("task %s: adopted sandbox %s", task_id, sandbox.short_id)
                return sandbox
        else:
            reason = describe_loss(info, None)
        SANDBOXES_LOST.labels("bound").inc()
        await self._drop(task_id, container_id, "lost")
        raise WorkspaceLost(reason)

    async def _restart(self, container_id: str) -> ContainerInfo | None:
        try:
            await self.docker.start(container_id)
        except docker.errors.DockerException as exc:
            log.warning("could not start stopped sandbox %s: %s", container_id[:12], exc)
        else:
            await self.docker.release_workspace(container_id)  # it holds its workspace again
        return await self.docker.inspect(container_id)

    async def _unpause(self, container_id: str) -> ContainerInfo | None:
        try:
            await self.docker.unpause(container_id)
        except docker.errors.DockerException as exc:
            log.warning("could not unpause kept sandbox %s: %s", container_id[:12], exc)
        return await self.docker.inspect(container_id)

    def idle_since(self, idle_s: float) -> list[str]:
        """Tasks of this replica whose sandbox has not been asked for in `idle_s` seconds."""
        cutoff = time.monotonic() - idle_s
        return [t for t in self._local if self._used.get(t, 0.0) < cutoff]

    async def stop_idle(self, task_id: str, idle_s: float) -> bool:
        """Stop the task's sandbox if it is still idle; it keeps its binding and files."""
        async with self._lock(task_id):
            sandbox = self._local.get(task_id)
            if sandbox is None or sandbox.lost:
                return False
            if self._used.get(task_id, 0.0) >= time.monotonic() - idle_s:
                return False  # asked for while we were deciding
            if not await self._stop_kept(task_id, sandbox):
                return False
            SANDBOXES_IDLE_STOPPED.inc()
            log.info("task %s: stopped idle sandbox %s (files kept)", task_id, sandbox.short_id)
            return True

    async def retain(self, task_id: str) -> bool:
        """The task ended: pause its sandbox, keeping its binding and files (retention.py
        removes it once its retention is over). False if there is none here to keep."""
        await self.renamed(task_id)
        async with self._lock(task_id):
            sandbox = self._local.get(task_id)
            if sandbox is None or sandbox.lost:
                bound = await self.bindings.get(task_id)
                # Stopped already (its task waited before it ended): its files are kept.
                return bound is not None and await self.bindings.stopped_at(bound) is not None
            return await self._set_aside(task_id, sandbox, self.docker.pause, "pause")

    async def _stop_kept(self, task_id: str, sandbox: Sandbox) -> bool:
        try:
            # A tmpfs workspace would lose its files with the stop: a keeper holds them.
            await self.docker.keep_workspace(sandbox.container_id)
        except (docker.errors.DockerException, LookupError) as exc:
            log.warning("not stopping %s: cannot keep its files: %s", sandbox.short_id, exc)
            return False
        return await self._set_aside(task_id, sandbox, self.docker.stop, "stop")

    async def _set_aside(
        self,
        task_id: str,
        sandbox: Sandbox,
        halt: Callable[[str], Awaitable[None]],
        verb: str,
    ) -> bool:
        """Mark the sandbox stopped on purpose, let go of it here, then `halt` it (a stop or a
        pause); its binding stays, and the task's next action finds it again."""
        # Marked first: a crash before the halt leaves a running sandbox that is simply
        # attached again; the other order could leave a halted one that looks dead.
        await self.bindings.mark_stopped(sandbox.container_id, time.time())
        self._local.pop(task_id, None)
        self.pool.forget(sandbox.container_id)
        await sandbox.session.close()
        try:
            await halt(sandbox.container_id)
        except docker.errors.DockerException as exc:
            log.warning("could not %s sandbox %s: %s", verb, sandbox.short_id, exc)
            return False
        return True

    async def lost(self, task_id: str, sandbox: Sandbox) -> str:
        """The sandbox died during an action: forget it and say why."""
        async with self._lock(task_id):
            if self._local.get(task_id) is sandbox:
                self._local.pop(task_id, None)
            client = sandbox.session
            if client.violated and client.lost_reason:
                reason = client.lost_reason  # the runtime ended it, for what it wrote
            else:
                # The attach stream may end a moment before Docker records the exit and its
                # cause.
                info = await self.docker.inspect(sandbox.container_id)
                for _ in range(10):
                    if info is None or not info.running:
                        break
                    await asyncio.sleep(0.1)
                    info = await self.docker.inspect(sandbox.container_id)
                reason = describe_loss(info, client.lost_reason)
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
                await self.bindings.clear_stopped(cid)
        self._locks.pop(task_id, None)
        self._used.pop(task_id, None)
        return bool(ids)

    def adopt(self, task_id: str, sandbox: Sandbox) -> None:
        """Take over a running task sandbox found by reconciliation."""
        sandbox.task_id = task_id
        self._used.setdefault(task_id, time.monotonic())  # idle time counts from adoption
        self._local[task_id] = sandbox
        self.pool.adopt(sandbox)

    def forget_local(self, task_id: str) -> None:
        """Drop the cached sandbox without removing it (e.g. at shutdown)."""
        self._local.pop(task_id, None)

    async def _drop(self, task_id: str, container_id: str, reason: str) -> None:
        # Unbind first: once the container is gone nobody may find it through the binding,
        # and a crash in between leaves an unbound container that reconcile removes. Let go
        # of before that: reconciliation must not bind it again by its name meanwhile.
        self.pool.let_go(container_id)
        await self.bindings.unbind(task_id, container_id)
        await self.pool.discard(container_id, reason)

    async def _touch(self, task_id: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._touched.get(task_id, 0.0) > _TOUCH_EVERY_S:
            self._touched[task_id] = now
            await self.bindings.touch(task_id)

    async def _why(self, container_id: str, lost_reason: str | None) -> str:
        return describe_loss(await self.docker.inspect(container_id), lost_reason)


def _restarted_notice(stopped_for_s: float) -> str:
    minutes = max(1, round(stopped_for_s / 60))
    return (
        f"[The sandbox was stopped while the task waited ({minutes} min) and has started again: "
        "the files in /workspace are as they were, but the shell and the Python session are "
        "new (working directory, environment variables, background processes and Python "
        "variables were reset).]"
    )


def describe_loss(info: ContainerInfo | None, lost_reason: str | None) -> str:
    """Why a sandbox is gone, in words an agent can act on."""
    if info is None:
        return "its container no longer exists"
    if info.oom_killed:
        return "its container was killed for exceeding the memory limit"
    if not info.running:
        return f"its container stopped ({info.status}, exit code {info.exit_code})"
    return lost_reason or "its executor stopped answering"
