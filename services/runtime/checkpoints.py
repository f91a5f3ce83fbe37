"""A checkpoint of /workspace after every action that can change files (issue 28).

Taken after the action's observation is published, while the agent thinks about its next
step; the task's next action on this replica waits for it (`settle`) only if it is not done.
The executor says what changed since the last checkpoint it was told was stored (`scan`,
deploy/sandbox/executor/snapshot.py), the runtime fetches the bytes of the files whose
contents the task has not stored yet (`pack`), stores them and the checkpoint's manifest in
the checkpoint store (checkpoint_store.py), then tells the executor (`commit`) and sends the
controller a WorkspaceCheckpointObservation for the log. An action that changed nothing gets
no checkpoint: the one before holds the same files.

A checkpoint never fails an action: one that cannot be taken is logged with why (`skipped`).
"""

from __future__ import annotations

import asyncio
import logging
import time

from nats.errors import Error as NatsError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.commands import ExecuteAction
from shared.events import EventSource, WorkspaceCheckpointObservation
from shared.forks import checkpoint_name
from shared.sandbox_protocol.messages import ScanEntry, ScanReply
from shared.sandbox_protocol.session import SandboxSessionError

from .checkpoint_fetch import fetch_and_store
from .checkpoint_manifest import FULL_EVERY, Entry, Manifest
from .checkpoint_point import (
    CheckpointPoint,
    Skip,
    changes_files,
    skipped_entry,
    unchanged_entry,
)
from .checkpoint_quota import CheckpointQuota, QuotaUsed
from .checkpoint_restore import RestoreArchives, put_back
from .checkpoint_store import CheckpointMissing, CheckpointStore, StoreFull
from .containers import DockerSandboxes
from .metrics import CHECKPOINT_BYTES, CHECKPOINT_SECONDS, CHECKPOINTS, RESTORES
from .sandbox import Sandbox
from .seating import Publish
from .settings import RuntimeSettings

__all__ = ["Checkpoints"]

log = logging.getLogger("deckhands.runtime.checkpoints")

_EMPTY = Manifest(seq=0, depth=FULL_EVERY - 1, entries={})  # the next one is stored whole


class Checkpoints:
    def __init__(
        self, settings: RuntimeSettings, store: CheckpointStore, redis: Redis, publish: Publish
    ) -> None:
        self.settings = settings
        self.store = store
        self.redis = redis
        self.publish = publish
        self.quota = CheckpointQuota(redis, settings)
        self._pending: dict[str, asyncio.Task[None]] = {}
        self.archives = RestoreArchives()  # one tar per checkpoint for restores made together
        # task -> (container, owner, seq): that sandbox's executor has committed the checkpoint
        # at seq, stored under `owner` (the task itself, or the parent a fork started from).
        self._synced: dict[str, tuple[str, str, int]] = {}
        self._anchored: dict[str, int] = {}  # task -> the last upload's seq taken here

    def after(self, command: ExecuteAction, sandbox: Sandbox, cwd: str = "") -> None:
        """The action ran in `sandbox` (leaving its shell in `cwd`): take its checkpoint in the
        background."""
        if changes_files(command) and command.action.seq:
            self.take(CheckpointPoint.after_action(command), sandbox, cwd)

    def after_checkout(self, task_id: str, tenant_id: str | None, sandbox: Sandbox) -> None:
        """The task's repository was checked out into its first sandbox: the workspace it was
        created with, checkpointed at seq 1 (the sandbox holds those files: none to restore)."""
        sandbox.fresh = False
        self.take(CheckpointPoint.after_checkout(task_id, tenant_id), sandbox)

    def take(self, point: CheckpointPoint, sandbox: Sandbox, cwd: str = "") -> None:
        """Take the checkpoint of `point` in the background, after the task's one before."""
        if not self.settings.checkpoints:
            return
        task_id = point.task_id
        if point.anchor:
            if self._anchored.get(task_id, 0) >= point.seq:
                return  # asked for by its order and by the next action: taken once
            self._anchored[task_id] = point.seq
        before = self._pending.get(task_id)
        run = asyncio.create_task(self._take(point, sandbox, before, cwd))
        self._pending[task_id] = run
        run.add_done_callback(lambda done: self._done(task_id, done))

    def _done(self, task_id: str, run: asyncio.Task[None]) -> None:
        if self._pending.get(task_id) is run:
            del self._pending[task_id]

    async def settle(self, task_id: str) -> None:
        """Before the task's next action: its last checkpoint done (or given up on)."""
        run = self._pending.get(task_id)
        if run is not None:
            await asyncio.wait({run}, timeout=self.settings.checkpoint_timeout_s + 5)

    def latest(self, command: ExecuteAction) -> int | None:
        """The seq of the task's last checkpoint: this replica's, or the one its log names."""
        source = self.source(command)
        return None if source is None else source[1]

    def source(self, command: ExecuteAction | CheckpointPoint) -> tuple[str, int] | None:
        """(whose, seq) of the checkpoint holding the task's files: the last this replica
        stored, or the one its log names (a fork's parent's, until it stores its own; a
        rewound task's point, whatever came after)."""
        synced = self._synced.get(command.task_id)
        if (
            synced is not None
            and synced[2] >= (command.checkpoint_seq or 0)
            and not command.restore_first
        ):
            return synced[1], synced[2]
        if command.checkpoint_seq:
            return command.checkpoint_task or command.task_id, command.checkpoint_seq
        return None

    async def before_action(
        self, command: ExecuteAction, sandbox: Sandbox, docker: DockerSandboxes
    ) -> None:
        """The last action's checkpoint done first (its scan must not see this action's
        files); a sandbox bound afresh gets the task's files back from the last one, and a
        rewound task's sandbox the files of the point it went back to. An upload's
        checkpoint not taken yet (its order still on its way, or its sandbox was stopped) is
        taken first."""
        await self.settle(command.task_id)
        if sandbox.fresh or command.restore_first:
            in_place = not sandbox.fresh
            sandbox.fresh = False
            await self.restore(command, sandbox, docker, in_place=in_place)
        due = CheckpointPoint.due_before(command)
        if due is not None and not command.restore_first:
            self.take(due, sandbox)
            await self.settle(command.task_id)

    async def restore(
        self,
        command: ExecuteAction,
        sandbox: Sandbox,
        docker: DockerSandboxes,
        *,
        in_place: bool = False,
    ) -> None:
        """The task's files from its checkpoint, and the agent told so with this action's
        output: into a new sandbox (its earlier one is gone), or (`in_place`, a rewind) into
        its own, emptied first."""
        source = self.source(command)
        if source is None and not command.restore_first:
            return  # a task's first sandbox: nothing to restore
        self._synced.pop(command.task_id, None)  # this executor's base is not that checkpoint
        notice, restored = await put_back(
            self.store, docker, sandbox, command, source, self.archives, in_place=in_place
        )
        sandbox.notice = notice
        if restored:
            RESTORES.inc()

    async def let_go(self, task_id: str) -> None:
        """The task's sandbox is released: its last checkpoint first, then nothing of it in
        memory (a task resumed later compares a full scan with the store)."""
        await self.settle(task_id)
        self.forget(task_id)

    def forget(self, task_id: str) -> None:
        """Keep nothing of the task in memory (its sandbox was released, or it was deleted)."""
        self._synced.pop(task_id, None)
        self._anchored.pop(task_id, None)
        self.store.forget(task_id)

    def remembered(self) -> set[str]:
        """The tasks of which something is kept in memory here."""
        return set(self._synced) | self.store.cached_tasks()

    async def remove(self, task_id: str, names: list[str] | None = None) -> int:
        """The task was deleted: its checkpoints go, and its bytes leave its tenant's count."""
        self.forget(task_id)
        removed = await self.store.remove_task(task_id, names)
        await self.quota.forget(task_id)
        return removed

    async def sweep(self) -> int:
        """Remove the checkpoints of tasks whose last one is past its retention."""
        retention = self.settings.checkpoint_retention_s
        if retention <= 0:
            return 0
        removed = 0
        for task_id, names in (await self.store.expired(retention)).items():
            if task_id not in self._pending:
                removed += await self.remove(task_id, names)
                log.info("task %s: checkpoints past their retention removed", task_id)
        return removed

    # -- taking one

    def not_running(self, point: CheckpointPoint) -> WorkspaceCheckpointObservation:
        """An upload's checkpoint that cannot be taken now: the task's sandbox is not running
        (kept paused or stopped); its next action takes it first."""
        CHECKPOINTS.labels("not_running").inc()
        skip = Skip(
            "not_running",
            "the task's sandbox is not running: the uploaded files are checkpointed before "
            "its next action",
        )
        return skipped_entry(point, skip, time.monotonic())

    async def _take(
        self,
        command: CheckpointPoint,
        sandbox: Sandbox,
        before: asyncio.Task[None] | None,
        cwd: str,
    ) -> None:
        if before is not None:
            await asyncio.wait({before})
        started = time.monotonic()
        outcome = "taken"
        try:
            async with asyncio.timeout(self.settings.checkpoint_timeout_s):
                event = await self._checkpoint(command, sandbox, started, cwd)
        except Skip as skip:
            outcome = skip.reason
            event = skipped_entry(command, skip, started)
        except StoreFull as exc:
            outcome = "store_full"
            event = skipped_entry(
                command, Skip("store_full", f"the checkpoint store is full ({exc})"), started
            )
        except (
            SandboxSessionError,
            TimeoutError,
            NatsError,
            RedisError,
            OSError,
            ValueError,
        ) as exc:
            outcome = "failed"
            log.warning(
                "task %s: checkpoint of seq %s failed: %r", command.task_id, command.seq, exc
            )
            self._synced.pop(command.task_id, None)
            event = skipped_entry(
                command,
                Skip("failed", f"the checkpoint could not be taken ({type(exc).__name__})"),
                started,
            )
        CHECKPOINTS.labels(outcome).inc()
        if event is None:
            return
        CHECKPOINT_SECONDS.observe(event.took_ms / 1000)
        try:
            await self.publish(event)
        except Exception:  # the next checkpoint covers the files again
            log.exception(
                "task %s: checkpoint of seq %s not sent", command.task_id, event.action_seq
            )

    async def _checkpoint(
        self, command: CheckpointPoint, sandbox: Sandbox, started: float, cwd: str
    ) -> WorkspaceCheckpointObservation | None:
        s = self.settings
        task_id = command.task_id
        seq = command.seq
        base, incremental, owner = await self._base(command, sandbox)
        first, changed = await self._scan(sandbox, incremental)
        if first["too_large"]:
            raise Skip(
                "too_large",
                f"the workspace holds more than {s.checkpoint_max_files} paths or "
                f"{s.checkpoint_max_workspace_bytes} bytes: it is not checkpointed",
                first["files"],
                first["bytes"],
            )
        now: dict[str, Entry] = {e["p"]: (e["t"], e["m"], e["s"], e["h"]) for e in changed}
        if incremental:
            removed = set(first["deleted"])
        else:
            removed = set(base.entries) - set(now)
        if all(base.entries.get(p) == e for p, e in now.items()) and not (
            removed & set(base.entries)
        ):
            await sandbox.session.commit({"scan": first["scan"]}, 30.0)
            self._synced[task_id] = (sandbox.container_id, owner, base.seq)
            # Nothing changed: the last checkpoint holds these files (an upload's entry says
            # so, a fork at it starts from that one; an action's needs none).
            return unchanged_entry(command, checkpoint_name(owner, base.seq), first, started)
        # A fork's first own checkpoint copies every content into its own name: the parent's
        # checkpoints go with the parent (its deletion, its retention), the fork's files stay.
        known = {e[3] for e in base.entries.values() if e[0] == "f"} if owner == task_id else set()
        wanted = sorted(
            {p for p, e in now.items() if e[0] == "f" and e[3] not in known and e[2] >= 0}
        )
        try:
            await self.quota.check(command, sum(now[p][2] for p in wanted))
        except QuotaUsed as exc:
            raise Skip("quota", str(exc), first["files"], first["bytes"]) from None
        stored, skipped = await fetch_and_store(
            self.store, sandbox, task_id, wanted, now, self.settings.checkpoint_timeout_s
        )
        delta = (
            base.delta_to(seq, now, removed, cwd or base.cwd)
            if owner == task_id
            else _EMPTY.delta_to(
                seq, now, set(), cwd or base.cwd
            )  # `now`: every path (a full scan)
        )
        whole = Manifest.whole(delta) if delta.base_seq is None else base.then(delta)
        stored += await self.store.put_manifest(task_id, delta, whole)
        await self.quota.add(command, stored)
        await sandbox.session.commit({"scan": first["scan"]}, 30.0)
        self._synced[task_id] = (sandbox.container_id, task_id, seq)
        CHECKPOINT_BYTES.inc(stored)
        return WorkspaceCheckpointObservation(
            task_id=task_id,
            source=EventSource.ENVIRONMENT,
            cause=command.cause,
            action_seq=seq,
            checkpoint=checkpoint_name(task_id, seq),
            base_seq=delta.base_seq,
            files=first["files"],
            bytes=first["bytes"],
            changed=sum(1 for p, e in now.items() if base.entries.get(p) != e)
            + len(removed & set(base.entries)),
            stored_bytes=stored,
            skipped_paths=first["skipped"] + skipped,
            took_ms=(time.monotonic() - started) * 1000,
        )

    async def _base(self, command: CheckpointPoint, sandbox: Sandbox) -> tuple[Manifest, bool, str]:
        """The checkpoint this one adds to, whether the executor's base is that one (then it
        reports only what changed; else every path, compared here), and whose it is (a fork's
        parent's until the fork stores its own: then every path is reported)."""
        task_id = command.task_id
        synced = self._synced.get(task_id)
        source = (synced[1], synced[2]) if synced is not None else self.source(command)
        if source is None:
            return _EMPTY, synced is not None and synced[0] == sandbox.container_id, task_id
        owner, at = source
        incremental = synced is not None and synced[0] == sandbox.container_id
        try:
            base = await self.store.manifest(owner, at)
        except CheckpointMissing:
            self._synced.pop(task_id, None)
            return _EMPTY, False, task_id
        return base, incremental and owner == task_id, owner

    async def _scan(self, sandbox: Sandbox, incremental: bool) -> tuple[ScanReply, list[ScanEntry]]:
        s = self.settings
        first = await sandbox.session.scan(
            {
                "full": not incremental,
                "max_files": s.checkpoint_max_files,
                "max_bytes": s.checkpoint_max_workspace_bytes,
            },
            s.checkpoint_timeout_s,
        )
        changed = list(first["changed"])
        page = first
        while page["more"]:
            page = await sandbox.session.scan(
                {"scan": first["scan"], "start": len(changed)}, s.checkpoint_timeout_s
            )
            changed += page["changed"]
        return first, changed
