"""POST /v1/tasks/{id}/fork: `count` new tasks of the tenant, each starting from the parent's log
and files at a seq (issue 28, item 2); and POST /v1/tasks/{id}/rewind, the same in place
(item 4): checked here as a fork is, then applied by the controller.

The gateway checks what it can answer at once: the parent is the caller's (404 otherwise, as
for any task), it is a task made through the API (a sub-task is its root's), its log reaches
the point (422), the files of that point were kept (409 when a checkpoint after it was skipped)
and are still kept (410 past the retention). Each fork is then made like a new task (quotas,
record, the request to make it) except that its creation request names the parent, the point
and the checkpoint; the controller copies the log and rebuilds the State (controller/fork.py).
A fork gets the parent's limits, egress policy, secrets and webhook unless the request sets
its own limits. With an Idempotency-Key, a retried request makes the same forks.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from pydantic import ValidationError
from redis.exceptions import RedisError

from shared.events import (
    AgentState,
    EventAdapter,
    EventBase,
    EventSource,
    RewindAction,
    new_id,
)
from shared.forks import REWINDABLE, ForkFiles, checkpoint_kept, files_at, parse_checkpoint
from shared.state import TaskState
from shared.task_creation import creation_request, derived_event_id, state_from_created

from ..errors import ForkPointGone, ForkRefused, QuotaExceeded, StorageUnavailable
from ..events.history import HistoryClient
from ..metrics import QUOTA_REFUSALS, TASKS_CREATED
from .idempotency import request_fingerprint
from .records import TaskRecord
from .service import TaskService
from .values import CreatedTask

__all__ = ["ForkSpec", "Forks", "TaskForks"]

log = logging.getLogger("deckhands.gateway.forks")


@dataclass(frozen=True)
class ForkSpec:
    at: int
    count: int = 1
    message: str | None = None
    labels: tuple[str, ...] = ()
    max_iterations: int | None = None
    max_budget_usd: float | None = None
    priority: str | None = None


@dataclass(frozen=True)
class Forks:
    files: ForkFiles
    created: list[CreatedTask]


class ForkPointInvalid(ForkRefused):
    status_code = 422


class TaskForks:
    def __init__(
        self,
        tasks: TaskService,
        history: HistoryClient,
        jetstream: Callable[[], JetStreamContext],
    ) -> None:
        self.tasks = tasks
        self.history = history
        self._jetstream = jetstream

    async def fork(
        self, parent_id: str, tenant_id: str, spec: ForkSpec, idempotency_key: str | None = None
    ) -> Forks:
        owned = await self.tasks.get_owned(parent_id, tenant_id)
        parent = owned.state
        if owned.record is None or parent.parent_task_id is not None:
            raise ForkRefused(
                f"task {parent_id} is a sub-task: fork its root task {parent.parent_task_id} "
                "at the step that delegated to it"
            )
        if parent.version == 0:
            raise ForkRefused(f"task {parent_id} has not started yet: it has nothing to fork")
        files = await self._files(parent_id, spec.at)
        ids = await self._fork_ids(parent_id, tenant_id, spec, idempotency_key)
        created = [await self._make(parent, tenant_id, fork_id, spec, files) for fork_id in ids]
        return Forks(files, created)

    async def rewind(
        self, task_id: str, tenant_id: str, to: int, idempotency_key: str | None = None
    ) -> RewindAction:
        """Ask the controller to rewind the task to seq `to` (agent_loop/rewind.py), once the
        point's files are known to be kept."""
        owned = await self.tasks.get_owned(task_id, tenant_id)
        state = owned.state
        if owned.record is None or state.parent_task_id is not None:
            raise ForkRefused(f"task {task_id} is a sub-task: it is rewound with its root task")
        if state.agent_state not in REWINDABLE:
            how = (
                "a stopped task stays stopped: fork it at that seq instead"
                if state.agent_state is AgentState.STOPPED
                else "pause it first (POST /v1/tasks/{id}/pause)"
            )
            raise ForkRefused(f"task {task_id} is {state.agent_state.value}: {how}")
        files = await self._files(task_id, to)
        event = RewindAction(
            id=await self.tasks._event_id(tenant_id, task_id, f"rewind:{to}", idempotency_key),
            task_id=task_id,
            source=EventSource.USER,
            to=to,
            checkpoint=files.checkpoint,
        )
        await self.tasks._publish(event)
        return event

    async def _files(self, parent_id: str, at: int) -> ForkFiles:
        entries: list[EventBase] = []
        try:
            async for raw in self.history.all_after(parent_id):
                entries.append(EventAdapter.validate_python(raw))
        except ValidationError as exc:
            raise ForkRefused(
                f"task {parent_id}'s log holds an entry this gateway cannot read"
            ) from exc
        last = max((e.seq or 0 for e in entries), default=0)
        if at > last:
            raise ForkPointInvalid(
                f"at: task {parent_id}'s log ends at seq {last}; fork at a seq from 1 to {last}"
            )
        files = files_at(entries, at)
        if files.unkept is not None:
            u = files.unkept
            raise ForkRefused(
                f"the files of task {parent_id} after seq {u.action_seq} were not kept "
                f"({u.skipped}: {u.detail or 'no checkpoint'}): fork at a seq before "
                f"{u.action_seq}"
            )
        if files.pending is not None:
            raise ForkRefused(
                f"the files uploaded into task {parent_id} at seq {files.pending} are not "
                f"checkpointed yet: try again in a moment, or use a seq before {files.pending}"
            )
        if files.checkpoint is not None:
            try:
                kept = await checkpoint_kept(self._jetstream(), files.checkpoint)
            except (NatsError, TimeoutError) as exc:
                raise StorageUnavailable(f"checkpoint store unavailable: {exc!r}") from exc
            if not kept:
                _, seq = parse_checkpoint(files.checkpoint)
                raise ForkPointGone(
                    f"the checkpoint of task {parent_id}'s files after seq {seq} is no longer "
                    "kept (checkpoints are kept for DECKHANDS_CHECKPOINT_RETENTION_S after a "
                    "task's last one)"
                )
        return files

    async def _fork_ids(
        self, parent_id: str, tenant_id: str, spec: ForkSpec, idempotency_key: str | None
    ) -> list[str]:
        """New ids; with an Idempotency-Key, ids derived from the first request's, so that a
        retry names the same forks (and makes those it had not made yet)."""
        if idempotency_key is None:
            return [new_id() for _ in range(spec.count)]
        try:
            batch = await self.tasks.idempotency.claim(
                tenant_id,
                idempotency_key,
                request_fingerprint(f"POST /v1/tasks/{parent_id}/fork", dataclasses.asdict(spec)),
                derived_event_id(parent_id, "fork", idempotency_key),
            )
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
        return [derived_event_id(batch, str(i)) for i in range(spec.count)]

    async def _make(
        self, parent: TaskState, tenant_id: str, fork_id: str, spec: ForkSpec, files: ForkFiles
    ) -> CreatedTask:
        """One fork, made like a new task: counted against the tenant's quotas, recorded, and
        asked of the controller."""
        tasks = self.tasks
        async with tasks.creations.slot():
            try:
                state = await tasks.store.load(fork_id)
                replayed = state is not None
                if state is None:
                    state = await self._request(parent, tenant_id, fork_id, spec, files)
            except RedisError as exc:
                raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
            if state.agent_state is AgentState.LOADING and state.version == 0:
                await tasks._publish(creation_request(state))
        if not replayed:
            TASKS_CREATED.inc()
        return CreatedTask(state=state, replayed=replayed)

    async def _request(
        self, parent: TaskState, tenant_id: str, fork_id: str, spec: ForkSpec, files: ForkFiles
    ) -> TaskState:
        tasks = self.tasks
        quotas = await tasks.quotas.quotas(tenant_id)
        try:
            budget = await tasks.quotas.admit(
                tenant_id,
                fork_id,
                spec.max_budget_usd or parent.initial_budget_usd or parent.max_budget_usd,
                quotas,
                parent.network is not None or parent.network_egress,
            )
        except QuotaExceeded:
            QUOTA_REFUSALS.inc()
            raise
        if tasks.attachments is not None:
            await tasks.attachments.inherit(parent.task_id, fork_id, tenant_id)
        record = await tasks.records.put(
            fork_id, TaskRecord(tenant_id=tenant_id, labels=spec.labels)
        )
        checkpoint_task, checkpoint_seq = (
            parse_checkpoint(files.checkpoint) if files.checkpoint else (None, None)
        )
        max_iterations = spec.max_iterations or parent.initial_max_iterations or 30
        state = parent.model_copy(
            update={
                "task_id": fork_id,
                "task": spec.message or "",
                "created_at": record.created_at,
                "updated_at": record.created_at,
                "agent_state": AgentState.LOADING,
                "max_iterations": spec.max_iterations or parent.max_iterations,
                "initial_max_iterations": max_iterations,
                "max_budget_usd": budget,
                "initial_budget_usd": budget,
                "priority": spec.priority or parent.priority,
                "forked_from": parent.task_id,
                "forked_at": spec.at,
                "checkpoint_task": checkpoint_task,
                "checkpoint_seq": checkpoint_seq,
                "version": 0,
            }
        )
        return state_from_created(await tasks.store.creations.put(creation_request(state)))
