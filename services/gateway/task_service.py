"""Creating tasks and sending user input to them: the logic behind /v1/tasks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any

from faststream.nats import NatsBroker
from redis.exceptions import RedisError

from shared.admission import QueuePlace, queue_place
from shared.events import (
    TERMINAL_STATES,
    AgentState,
    ChangeAgentStateAction,
    EventBase,
    EventSource,
    MessageAction,
    RiskLevel,
    TaskCreatedObservation,
    TaskPriority,
    new_id,
    utc_now,
)
from shared.publishing import MessageTooLarge, check_size, publish_event_to
from shared.state import TaskState
from shared.subjects import Service
from shared.task_creation import creation_request, derived_event_id, state_from_created
from shared.trajectory import save_trajectory

from .creation_slots import CreationSlots
from .errors import (
    EgressForbidden,
    PayloadTooLarge,
    PublishFailed,
    QuotaExceeded,
    StorageUnavailable,
    TaskNotFound,
    TrajectoryForbidden,
    WorkspaceTooLarge,
)
from .idempotency import IdempotencyKeys, request_fingerprint
from .metrics import QUOTA_REFUSALS, TASKS_CREATED, USER_EVENTS
from .quotas import QuotaDefaults, Quotas, TenantQuotas
from .repositories import RepositoryCheck, RepositoryRefused
from .secret_service import SecretsOff
from .task_attachments import TaskAttachments
from .task_creations import TaskViews
from .task_records import TaskRecord, TaskRecords
from .webhooks import WebhookSpec

__all__ = [
    "CreatedTask",
    "NewTask",
    "OwnedTask",
    "TaskDefaults",
    "TaskService",
    "derived_event_id",
    "valid_task_id",
]

log = logging.getLogger("deckhands.gateway.tasks")

_TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
# A sub-task belongs to its root task's tenant; delegation is far shallower than this.
_MAX_DELEGATION_DEPTH = 64


def valid_task_id(task_id: str) -> bool:
    """Ids the gateway could have issued; anything else cannot name a task (or a subject token)."""
    return bool(_TASK_ID.fullmatch(task_id))


@dataclass(frozen=True)
class NewTask:
    """What a client asks for; None means the server's default."""

    task: str
    max_iterations: int | None = None
    max_budget_usd: float | None = None
    confirmation_mode: bool | None = None
    confirmation_threshold: RiskLevel | None = None
    network_egress: bool = False
    workspace_mib: int | None = None  # the /workspace quota; None: the runtime's default
    trajectory: list[dict[str, Any]] | None = None
    labels: tuple[str, ...] = ()
    repository: dict[str, Any] | None = None  # the fields of a RepositorySpec (issue 11)
    secrets: tuple[str, ...] = ()  # the tenant's secrets its commands get (issue 11)
    webhook: WebhookSpec | None = None  # else the tenant's default
    priority: TaskPriority = TaskPriority.INTERACTIVE


@dataclass(frozen=True)
class TaskDefaults:
    """The server's defaults for a task. Its budget, delegation limits and whether it may be
    a replay are the tenant's quotas (services.gateway.quotas)."""

    max_iterations: int = 30
    confirmation_mode: bool = False
    confirmation_threshold: RiskLevel = RiskLevel.HIGH
    network_egress_allowed: bool = False
    max_workspace_mib: int = 8192


@dataclass(frozen=True)
class CreatedTask:
    state: TaskState
    replayed: bool  # an earlier request with the same Idempotency-Key made this task


@dataclass(frozen=True)
class OwnedTask:
    """A task the caller may see: its State and, for a task created through the API (not a
    sub-task), the gateway's record of it."""

    state: TaskState
    record: TaskRecord | None

    @property
    def labels(self) -> tuple[str, ...]:
        return () if self.record is None else self.record.labels


class TaskService:
    def __init__(
        self,
        store: TaskViews,
        broker: NatsBroker,
        *,
        defaults: TaskDefaults,
        idempotency_ttl_s: int,
        pool_name: str = "default",
        quota_defaults: QuotaDefaults | None = None,
        creations: CreationSlots | None = None,
    ) -> None:
        self.store = store
        self.broker = broker
        self.defaults = defaults
        self.records = TaskRecords(store.redis)
        self.idempotency = IdempotencyKeys(store.redis, idempotency_ttl_s)
        self.pool_name = pool_name
        self.creations = creations or CreationSlots(128, 1.0)
        self.quotas = TenantQuotas(store, quota_defaults or QuotaDefaults(), pool_name)
        self.quotas.tasks = self.records  # counts what Redis lost again from the tasks
        # A new task's repository (services.gateway.workspace_service sets it): None, refused.
        self.repositories: RepositoryCheck | None = None
        # Secrets and webhook of a new task (services.gateway.context sets it): None, neither.
        self.attachments: TaskAttachments | None = None

    async def queue_place(self, state: TaskState) -> QueuePlace | None:
        """The task's place in the queue for a sandbox, while it waits for one (its first
        action, or its sandbox prepared while the agent thinks)."""
        if state.agent_state in TERMINAL_STATES:
            return None
        try:
            return await queue_place(self.store.redis, self.pool_name, state.task_id)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

    async def get(self, task_id: str, tenant_id: str) -> TaskState:
        return (await self.get_owned(task_id, tenant_id)).state

    async def get_owned(self, task_id: str, tenant_id: str) -> OwnedTask:
        """The task, if it is the tenant's. Another tenant's task is not found, exactly like a
        task that does not exist: its id tells a caller nothing."""
        if not valid_task_id(task_id):
            raise TaskNotFound(task_id)
        try:
            state, record = await asyncio.gather(
                self.store.load(task_id), self.records.cached(task_id)
            )
            if state is not None and record is None and state.parent_task_id is None:
                record = await self.records.get(task_id)  # Redis lost it: the durable copy
            owner = None if state is None else await self._owner(state, record)
            if state is None and not await self.store.intact():
                await self._restoring(task_id, tenant_id, record)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc
        if state is None or owner != tenant_id:
            raise TaskNotFound(task_id)
        return OwnedTask(state, record)

    async def _restoring(self, task_id: str, tenant_id: str, record: TaskRecord | None) -> None:
        """Redis lost its data and the controller has not rebuilt every State from the logs
        yet: a task of the caller's (its durable record says so) is being restored, not gone."""
        record = record or await self.records.get(task_id)
        if record is not None and record.tenant_id == tenant_id:
            raise StorageUnavailable(
                f"task {task_id} is being restored from its log after the task state store "
                "lost its data; ask again shortly"
            )

    async def _owner(self, state: TaskState, record: TaskRecord | None) -> str | None:
        """The tenant of a task: its record's, or for a sub-task its root task's."""
        walked = False
        for _ in range(_MAX_DELEGATION_DEPTH):
            if record is not None:
                return record.tenant_id
            parent_id = state.parent_task_id
            if parent_id is None:
                if walked:  # the root's record, which Redis may have lost
                    root = await self.records.get(state.task_id)
                    return None if root is None else root.tenant_id
                return None  # made before tenants existed, or by hand: nobody's
            walked = True
            record = await self.records.cached(parent_id)
            if record is None:
                parent = await self.store.load(parent_id)
                if parent is None:
                    return None
                state = parent
        return None

    async def get_with_sub_tasks(
        self, task_id: str, tenant_id: str
    ) -> tuple[OwnedTask, list[TaskState]]:
        """The task and the sub-tasks it delegated (those whose State exists)."""
        owned = await self.get_owned(task_id, tenant_id)
        subs = [await self._load(sub_id) for sub_id in owned.state.sub_tasks]
        return owned, [sub for sub in subs if sub is not None]

    async def forget(self, task_id: str, record: TaskRecord) -> None:
        """Drop the gateway's record of a deleted task (the last of it to go) and free the
        Idempotency-Key it was created with."""
        if record.idempotency_key is not None:
            await self.idempotency.release(record.tenant_id, record.idempotency_key)
        await self.quotas.forget(record.tenant_id, task_id)
        if self.repositories is not None:
            await self.repositories.forget(task_id)
        if self.attachments is not None:
            await self.attachments.forget(task_id)
        await self.records.remove(task_id, record)

    async def _load(self, task_id: str) -> TaskState | None:
        try:
            return await self.store.load(task_id)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

    async def create(
        self, new: NewTask, tenant_id: str, idempotency_key: str | None = None
    ) -> CreatedTask:
        """Create the task (see _create), once a place among the creations in flight is free
        (Overloaded, 503 with Retry-After, if none frees soon)."""
        async with self.creations.slot():
            return await self._create(new, tenant_id, idempotency_key)

    async def _create(
        self, new: NewTask, tenant_id: str, idempotency_key: str | None = None
    ) -> CreatedTask:
        """Save the task's record and ask the controller to make it (a creation request with
        the task's text; only the controller writes a task's State).

        With an Idempotency-Key every step is safe to repeat, so a retry after any partial
        failure (key claimed, record saved, publish lost) finishes the same task:
        - the key is bound to this request and one task id in Redis (set-if-absent), in the
          tenant's namespace; the same key with another request is refused;
        - the record and the kept request are created only if missing;
        - the request's id is derived from the task id, so publishing it again is
          deduplicated, and it is published again only while the controller has not made the
          task (the gateway shows the kept request's State, version 0, until then).
        """
        quotas = await self._allowed(new, tenant_id)
        webhook = await self._check_attachments(new, tenant_id)
        repository = None
        if new.repository is not None:
            if self.repositories is None:
                raise RepositoryRefused("repository: not available on this gateway")
            repository = await self.repositories.check(tenant_id, new.repository)
        candidate = new_id()
        try:
            task_id = (
                candidate
                if idempotency_key is None
                else await self.idempotency.claim(
                    tenant_id,
                    idempotency_key,
                    request_fingerprint("POST /v1/tasks", dataclasses.asdict(new)),
                    candidate,
                )
            )
            replayed = task_id != candidate
            state = await self.store.load(task_id) if replayed else None
            if replayed and state is None and not await self.store.intact():
                # Redis lost its data: the key's task may have a log whose State the
                # controller has not rebuilt yet. Made again here, it would start over.
                raise StorageUnavailable(
                    f"task {task_id} (this Idempotency-Key's) is being restored after the "
                    "task state store lost its data; send the request again shortly"
                )
            if state is None:
                budget = await self._admit(new, tenant_id, task_id, quotas, idempotency_key)
                record = TaskRecord(
                    tenant_id=tenant_id, labels=new.labels, idempotency_key=idempotency_key
                )
                if self.attachments is not None:  # before the first message: see there
                    await self.attachments.attach(task_id, tenant_id, new.secrets, webhook)
                if repository is not None and self.repositories is not None:
                    # Before the first message: the runtime reads it for the first sandbox.
                    await self.repositories.record(task_id, tenant_id, repository)
                state = await self._request_task(
                    task_id, await self._redacted(new, tenant_id), record, budget, quotas
                )
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

        if state.agent_state is AgentState.LOADING and state.version == 0:
            try:
                await self._publish(creation_request(state))
            except PublishFailed:
                # No retry can reach a task without a key: do not leave it LOADING forever.
                # Unless the controller has it already: the request was stored and only its
                # acknowledgement came late (JetStream under load); then it is accepted.
                if idempotency_key is not None or await self._mark_unqueued(task_id):
                    raise
                log.info("task %s: queued, though JetStream acknowledged it late", task_id)
        if not replayed:
            TASKS_CREATED.inc()
        return CreatedTask(state=state, replayed=replayed)

    async def _allowed(self, new: NewTask, tenant_id: str) -> Quotas:
        """The tenant's quotas, once the request is one this server and tenant accept: its text
        fits a message, and it asks for no more than the operator allows."""
        self._fits(
            TaskCreatedObservation(
                id=f"created-{'0' * 32}",
                task_id="0" * 32,
                source=EventSource.SYSTEM,
                created_at=utc_now(),
                max_iterations=1,
                tenant_id=tenant_id,
                task=new.task,
            ),
            "the task text",
        )
        if new.network_egress and not self.defaults.network_egress_allowed:
            raise EgressForbidden(
                "network_egress is disabled on this server (DECKHANDS_ALLOW_NETWORK_EGRESS=false); "
                "create the task without it"
            )
        if new.workspace_mib is not None and new.workspace_mib > self.defaults.max_workspace_mib:
            raise WorkspaceTooLarge(
                f"workspace_mib {new.workspace_mib} is above this server's maximum of "
                f"{self.defaults.max_workspace_mib} MiB (DECKHANDS_MAX_WORKSPACE_MIB)"
            )
        quotas = await self.quotas.quotas(tenant_id)
        if new.trajectory is not None and not quotas.allow_trajectory_tasks:
            raise TrajectoryForbidden(
                f"tenant {tenant_id!r} may not create a task from a trajectory: the operator "
                "allows it per tenant (PUT /v1/admin/tenants/{id}/limits with "
                '{"allow_trajectory_tasks": true})'
            )
        return quotas

    async def _redacted(self, new: NewTask, tenant_id: str) -> NewTask:
        """`new` with a value of a secret it names, typed into its text, as `<secret:NAME>`:
        the State keeps the text, the task's view and its trajectory export show it (the
        controller redacts the first message it makes of it as any other input)."""
        if not new.secrets or self.attachments is None:
            return new
        redactor = await self.attachments.secrets.redactor(tenant_id, new.secrets)
        return dataclasses.replace(new, task=redactor.text(new.task))

    async def _check_attachments(self, new: NewTask, tenant_id: str) -> WebhookSpec | None:
        """The webhook the task will notify, once its secrets and webhook are acceptable."""
        if self.attachments is None:
            if new.secrets or new.webhook is not None:
                raise SecretsOff()
            return None
        return await self.attachments.check(tenant_id, new.secrets, new.webhook)

    async def _admit(
        self,
        new: NewTask,
        tenant_id: str,
        task_id: str,
        quotas: Quotas,
        idempotency_key: str | None,
    ) -> float | None:
        """Count the task against the tenant's quotas; its budget (the request's, else the
        tenant's default, capped by a daily spend limit). Refused, the Idempotency-Key is freed:
        the same request may be sent again once the tenant is under its limits."""
        try:
            return await self.quotas.admit(tenant_id, task_id, new.max_budget_usd, quotas)
        except QuotaExceeded:
            QUOTA_REFUSALS.inc()
            if idempotency_key is not None:
                await self.idempotency.release(tenant_id, idempotency_key)
            raise

    async def _request_task(
        self,
        task_id: str,
        new: NewTask,
        record: TaskRecord,
        budget: float | None,
        quotas: Quotas,
    ) -> TaskState:
        """Save the task's record and keep the request to make it (shared/task_creation.py);
        the State the controller will make of it, as the gateway shows it until then."""
        record = await self.records.put(task_id, record)
        d = self.defaults
        max_iterations = new.max_iterations or d.max_iterations
        state = TaskState(
            task_id=task_id,
            task=new.task,
            created_at=record.created_at,
            updated_at=record.created_at,
            agent_state=AgentState.LOADING,
            # The initial limits are what a resuming user message adds again (seed 001).
            max_iterations=max_iterations,
            initial_max_iterations=max_iterations,
            max_budget_usd=budget,
            initial_budget_usd=budget,
            confirmation_mode=d.confirmation_mode
            if new.confirmation_mode is None
            else new.confirmation_mode,
            confirmation_threshold=new.confirmation_threshold or d.confirmation_threshold,
            network_egress=new.network_egress,
            workspace_mib=new.workspace_mib,
            tenant_id=record.tenant_id,
            priority=new.priority,
            max_delegation_depth=quotas.max_delegation_depth,
            max_sub_tasks=quotas.max_sub_tasks,
        )
        if new.trajectory is not None:
            # Saved before the task is made, so its first step already sees it.
            await save_trajectory(self.store.redis, task_id, new.trajectory)
        # A concurrent request with the same key may have kept its request first: use theirs.
        return state_from_created(await self.store.creations.put(creation_request(state)))

    async def _mark_unqueued(self, task_id: str) -> bool:
        """Show the new task as failed; False when the controller has made it (it took the
        request, whose publish only looked lost)."""
        try:
            if await self.store.exists(task_id):
                return False
            await self.store.creations.mark_unqueued(
                task_id, "the task could not be queued for the controller"
            )
        except RedisError as exc:
            log.warning("task %s: could not mark unqueued task failed: %s", task_id, exc)
        return True

    async def send_message(
        self, task_id: str, content: str, tenant_id: str, idempotency_key: str | None = None
    ) -> EventBase:
        owned = await self.get_owned(task_id, tenant_id)
        if owned.record is not None:
            # A message resumes a task that had ended: it runs (and spends) again. A
            # sub-task's root counts for it.
            try:
                await self.quotas.readmit(
                    tenant_id, owned.state, await self.quotas.quotas(tenant_id)
                )
            except QuotaExceeded:
                QUOTA_REFUSALS.inc()
                raise
        event = MessageAction(
            id=await self._event_id(
                tenant_id, task_id, "message", idempotency_key, content=content
            ),
            task_id=task_id,
            source=EventSource.USER,
            content=content,
        )
        await self._publish(event)
        return event

    async def change_state(
        self,
        task_id: str,
        agent_state: AgentState,
        reason: str,
        *,
        tenant_id: str,
        cause: str | None = None,
        idempotency_key: str | None = None,
    ) -> EventBase:
        """Ask the controller for a state change; it alone decides whether it is legal."""
        await self.get(task_id, tenant_id)
        event = ChangeAgentStateAction(
            id=await self._event_id(
                tenant_id, task_id, f"state:{agent_state.value}:{cause}", idempotency_key
            ),
            task_id=task_id,
            source=EventSource.USER,
            agent_state=agent_state,
            reason=reason,
            cause=cause,
        )
        await self._publish(event)
        return event

    async def _event_id(
        self,
        tenant_id: str,
        task_id: str,
        purpose: str,
        idempotency_key: str | None,
        **body: Any,
    ) -> str:
        """A new id; with an Idempotency-Key, one derived from it (a retried publish is
        deduplicated), once the key is bound to this very request."""
        if idempotency_key is None:
            return new_id()
        event_id = derived_event_id(task_id, purpose, idempotency_key)
        try:
            return await self.idempotency.claim(
                tenant_id,
                idempotency_key,
                request_fingerprint(f"{purpose} /v1/tasks/{task_id}", body),
                event_id,
            )
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

    def _fits(self, event: EventBase, what: str) -> None:
        """Refuse, before anything is stored, what no message could carry."""
        try:
            check_size(self.broker, event.model_dump_json().encode(), what)
        except MessageTooLarge as exc:
            raise PayloadTooLarge(str(exc)) from exc

    async def _publish(self, event: EventBase) -> None:
        self._fits(event, f"the {type(event).__name__}")
        try:
            await publish_event_to(self.broker, Service.CONTROLLER, event)
        except Exception as exc:
            raise PublishFailed(
                f"could not queue the {type(event).__name__} for the controller "
                f"({type(exc).__name__}: {exc}); nothing was accepted, retry the request"
            ) from exc
        USER_EVENTS.labels(getattr(event, "kind", "event")).inc()
