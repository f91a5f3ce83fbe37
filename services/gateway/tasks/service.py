"""Creating tasks and sending user input to them: the logic behind /v1/tasks."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from faststream.nats import NatsBroker
from redis.exceptions import RedisError

from shared.events import (
    AgentState,
    ChangeAgentStateAction,
    EventBase,
    EventSource,
    MessageAction,
    TaskCreatedObservation,
    new_id,
    utc_now,
)
from shared.publishing import MessageTooLarge, check_size, publish_event_to
from shared.state import TaskState
from shared.subjects import Service
from shared.task_creation import creation_request, derived_event_id, state_from_created
from shared.trajectory import save_trajectory

from ..errors import (
    PayloadTooLarge,
    PublishFailed,
    QuotaExceeded,
    StorageUnavailable,
    TrajectoryForbidden,
    WorkspaceTooLarge,
)
from ..metrics import QUOTA_REFUSALS, TASKS_CREATED, USER_EVENTS
from ..quotas.limits import QuotaDefaults, Quotas
from ..quotas.service import TenantQuotas
from ..secrets.service import SecretsOff
from ..webhooks.models import WebhookSpec
from ..workspace.repositories import RepositoryCheck, RepositoryRefused
from .attachments import TaskAttachments
from .creation_slots import CreationSlots
from .creations import TaskCreations, TaskViews
from .egress import TaskEgress, TaskNetwork, message_egress, task_egress
from .idempotency import IdempotencyKeys, request_fingerprint
from .lookup import TaskLookup
from .records import TaskRecord, TaskRecords
from .values import CreatedTask, NewTask, TaskDefaults

__all__ = ["TaskService"]

log = logging.getLogger("deckhands.gateway.tasks")


class TaskService(TaskLookup):
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
        # A new task's repository (services.gateway.context sets it): None, refused.
        self.repositories: RepositoryCheck | None = None
        # Secrets and webhook of a new task (services.gateway.context sets it): None, neither.
        self.attachments: TaskAttachments | None = None

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
        quotas, egress = await self._allowed(new, tenant_id)
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
                    task_id, await self._redacted(new, tenant_id), record, budget, quotas, egress
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

    async def _allowed(self, new: NewTask, tenant_id: str) -> tuple[Quotas, TaskEgress]:
        """The tenant's quotas and the task's egress, once the request is one this server and
        tenant accept: its text fits a message, and it asks for no more than the operator
        allows."""
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
        if new.workspace_mib is not None and new.workspace_mib > self.defaults.max_workspace_mib:
            raise WorkspaceTooLarge(
                f"workspace_mib {new.workspace_mib} is above this server's maximum of "
                f"{self.defaults.max_workspace_mib} MiB (DECKHANDS_MAX_WORKSPACE_MIB)"
            )
        limits = await self.quotas.limits(tenant_id)
        quotas = self.quotas.quotas_of(limits)
        egress = task_egress(
            new, self.defaults, quotas.egress_allow, limits.egress_allow is not None
        )
        if new.trajectory is not None and not quotas.allow_trajectory_tasks:
            raise TrajectoryForbidden(
                f"tenant {tenant_id!r} may not create a task from a trajectory: the operator "
                "allows it per tenant (PUT /v1/admin/tenants/{id}/limits with "
                '{"allow_trajectory_tasks": true})'
            )
        return quotas, egress

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
            egress = bool(new.network_allow or new.network_presets or new.network_egress)
            return await self.quotas.admit(tenant_id, task_id, new.max_budget_usd, quotas, egress)
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
        egress: TaskEgress,
    ) -> TaskState:
        """Save the task's record and keep the request to make it (shared/task_creation.py);
        the State the controller will make of it, as the gateway shows it until then."""
        record = await self.records.put_durable(task_id, record)
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
            network_egress=egress.network_egress,
            network=egress.network,
            workspace_mib=new.workspace_mib,
            tenant_id=record.tenant_id,
            priority=new.priority,
            max_delegation_depth=quotas.max_delegation_depth,
            max_sub_tasks=quotas.max_sub_tasks,
        )
        if new.trajectory is not None:
            # Saved before the task is made, so its first step already sees it.
            await save_trajectory(self.store.redis, task_id, new.trajectory)
        # The record (cached for every request) and the request the controller makes the task
        # of, in one round trip. A concurrent request with the same key may have kept its
        # record and request first: the request kept is theirs, and so is the State shown.
        async with self.store.redis.pipeline(transaction=True) as tx:
            self.records.cache_in(tx, task_id, record)
            TaskCreations.put_in(tx, creation_request(state))
            return state_from_created(TaskCreations.kept(await tx.execute()))

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
        self,
        task_id: str,
        content: str,
        tenant_id: str,
        idempotency_key: str | None = None,
        network: TaskNetwork | None = None,
    ) -> EventBase:
        owned = await self.get_owned(task_id, tenant_id)
        widening = None
        if network is not None:  # more egress with the message, within the task's bound
            limits = await self.quotas.limits(tenant_id)
            bound = self.quotas.quotas_of(limits).egress_allow
            tenant_bound = limits.egress_allow is not None
            widening = message_egress(
                network, owned.state.network, self.defaults, bound, tenant_bound
            )
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
            network=widening,
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
