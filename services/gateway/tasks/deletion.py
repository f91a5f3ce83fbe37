"""DELETE /v1/tasks/{id}: stop the task (and its sub-tasks) if need be, then remove everything
kept of it: its log (the JetStream subject and storage's copies), its blobs, its State and
trajectory, and the gateway's record of it.

Storage's copies go twice over: the deletion is announced on the deletions stream, which every
storage replica consumes with a durable consumer of its own (a replica that is down applies it
when it is back, and from then on keeps nothing more of the task), and the replicas that are up
are asked at once (request/reply), so that the task's history is gone when DELETE answers.

A task is deleted from its root: a sub-task belongs to its parent's log and answer, and goes
with it. Everything is removed before the record, so that a deletion that fails half-way (a
restarted gateway, storage not answering) leaves a task its owner still sees and can delete
again; the record goes last, and with it the task (404 from then on).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from nats.js.errors import NotFoundError
from redis.exceptions import RedisError

from shared.blobs import BlobStore
from shared.commands import ForgetTaskRequest
from shared.events import SANDBOX_ENDING_STATES, AgentState
from shared.publishing import publish_json
from shared.state import TaskState
from shared.subjects import DELETIONS_STREAM, EVENTS_STREAM, deletion_subject, event_subject
from shared.trajectory import trajectory_key

from ..errors import GatewayError, StorageUnavailable, TaskNotStopped
from ..events.history import HistoryClient
from .service import TaskService
from .values import OwnedTask

__all__ = ["SubTaskNotDeletable", "TaskDeletion", "announce_deletion", "blob_refs"]

log = logging.getLogger("deckhands.gateway.deletion")

_POLL_S = 0.2


class SubTaskNotDeletable(GatewayError):
    status_code = 409

    def __init__(self, task_id: str, parent_id: str | None) -> None:
        super().__init__(
            f"task {task_id!r} is a sub-task of {parent_id!r}: delete its root task, which "
            "takes its sub-tasks with it"
        )


def blob_refs(value: Any) -> set[str]:
    """The SHA-256 of every blob an event refers to (`content_ref`, at any depth)."""
    found: set[str] = set()
    if isinstance(value, dict):
        ref = value.get("content_ref")
        if isinstance(ref, dict) and isinstance(ref.get("sha256"), str):
            found.add(ref["sha256"])
        for item in value.values():
            found |= blob_refs(item)
    elif isinstance(value, list):
        for item in value:
            found |= blob_refs(item)
    return found


async def announce_deletion(broker: NatsBroker, task_id: str) -> None:
    """Tell every storage replica, through the deletions stream, that the task is deleted."""
    try:
        await publish_json(
            broker,
            deletion_subject(task_id),
            ForgetTaskRequest(task_id=task_id),
            f"deleted-{task_id}",
            DELETIONS_STREAM,
        )
    except Exception as exc:
        raise StorageUnavailable(f"the deletions stream (NATS) is unavailable: {exc}") from exc


class TaskDeletion:
    def __init__(
        self,
        tasks: TaskService,
        history: HistoryClient,
        broker: NatsBroker,
        blobs: BlobStore,
        *,
        stop_timeout_s: float,
    ) -> None:
        self.tasks = tasks
        self.history = history
        self.broker = broker
        self.blobs = blobs
        self.stop_timeout_s = stop_timeout_s

    async def delete(self, task_id: str, tenant_id: str) -> None:
        owned = await self.tasks.get_owned(task_id, tenant_id)
        if owned.record is None:
            raise SubTaskNotDeletable(task_id, owned.state.parent_task_id)
        tree = await self._stopped_tree(owned, tenant_id)
        for state in reversed(tree):  # sub-tasks first, the root (and its record) last
            await self._remove(state.task_id)
        try:
            await self.tasks.forget(task_id, owned.record)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
        log.info("task %s deleted (%d sub-tasks) by tenant %s", task_id, len(tree) - 1, tenant_id)

    async def _tree(self, root: TaskState) -> list[TaskState]:
        """The task and every sub-task under it whose State exists, root first."""
        tree, queue = [root], [root]
        while queue:
            subs = await self.tasks.store.load_many(queue.pop().sub_tasks)
            for sub in subs:
                if sub is not None and all(sub.task_id != t.task_id for t in tree):
                    tree.append(sub)
                    queue.append(sub)
        return tree

    async def _stopped_tree(self, owned: OwnedTask, tenant_id: str) -> list[TaskState]:
        """Ask every task of the tree that could still run an action to stop, and wait until
        none can: a task still running would write its log and blobs again after removal."""
        tree = await self._tree(owned.state)
        asked: set[str] = set()
        deadline = time.monotonic() + self.stop_timeout_s
        while running := [s for s in tree if s.agent_state not in SANDBOX_ENDING_STATES]:
            for state in running:
                if state.task_id not in asked:
                    await self.tasks.change_state(
                        state.task_id, AgentState.STOPPED, "deleted by user", tenant_id=tenant_id
                    )
                    asked.add(state.task_id)
            if time.monotonic() > deadline:
                names = ", ".join(f"{s.task_id} ({s.agent_state.value})" for s in running)
                raise TaskNotStopped(
                    f"not deleted: {names} did not stop within {self.stop_timeout_s:g}s "
                    "(is the controller running?); nothing was removed, retry the request"
                )
            await asyncio.sleep(_POLL_S)
            root = await self.tasks.store.load(owned.state.task_id)
            if root is None:
                return []  # deleted meanwhile, by a concurrent request
            tree = await self._tree(root)
        return tree

    async def _remove(self, task_id: str) -> None:
        # The blobs are named in the log: read it before it goes.
        refs: set[str] = set()
        async for event in self.history.all_after(task_id):
            refs |= blob_refs(event)
        try:
            await self.broker.connection.jetstream().purge_stream(
                EVENTS_STREAM, subject=event_subject(task_id)
            )
        except NotFoundError:
            pass  # no stream, no log
        except Exception as exc:
            raise StorageUnavailable(f"the event log (NATS) is unavailable: {exc}") from exc
        await announce_deletion(self.broker, task_id)
        await self.history.forget(task_id)
        try:
            for sha256 in refs:
                await self.blobs.delete(task_id, sha256)
        except Exception as exc:
            raise StorageUnavailable(f"the blob store (NATS) is unavailable: {exc}") from exc
        try:
            await self.tasks.store.redis.delete(trajectory_key(task_id))
            # The State and its deadline are the controller's: it removes them when the
            # deletions stream tells it (announced above). The gateway's copy of the creation
            # request is the gateway's.
            await self.tasks.store.creations.forget(task_id)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
