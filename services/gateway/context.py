"""The gateway's services, built once per process in the lifespan (the routes get them through
Depends), and the webhook deliverer and workspace service built beside them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from faststream.nats import NatsBroker
from redis.asyncio import Redis

from shared.blobs import BlobStore
from shared.egress_policy import EgressPolicy
from shared.secrets_store import SecretsStore
from shared.subjects import SECRETS_BUCKET
from shared.workspace import WorkspaceTransfers

from .events.history import HistoryClient
from .events.service import EventService
from .health.service import ReadinessService
from .quotas.limits import QuotaDefaults
from .quotas.service import TenantQuotas
from .secrets.records import SecretsRefill
from .secrets.service import SecretService
from .settings import GatewaySettings
from .tasks.attachments import TaskAttachments
from .tasks.creation_slots import CreationSlots
from .tasks.creations import TaskViews
from .tasks.deletion import TaskDeletion
from .tasks.forks import TaskForks
from .tasks.listing import TaskListing
from .tasks.service import TaskService
from .tasks.values import TaskDefaults
from .tenants.records import TenantRecords
from .tenants.service import TenantService
from .tenants.store import TenantStore
from .webhooks.delivery import WebhookDeliverer
from .webhooks.policy import DeliveryPolicy
from .webhooks.store import WebhookStore
from .workspace.blobs import BlobService
from .workspace.repositories import RepositoryCheck
from .workspace.service import WorkspaceService

__all__ = [
    "BlobServiceDep",
    "EventServiceDep",
    "GatewayContext",
    "ReadinessServiceDep",
    "TaskDeletionDep",
    "TaskForksDep",
    "TaskListingDep",
    "TaskServiceDep",
    "TenantQuotasDep",
    "TenantServiceDep",
    "TenantStoreDep",
    "build_context",
    "build_deliverer",
    "build_workspace",
    "get_context",
    "quota_defaults",
]


@dataclass(frozen=True)
class GatewayContext:
    settings: GatewaySettings
    broker: NatsBroker
    redis: Redis
    tasks: TaskService
    events: EventService
    readiness: ReadinessService
    blobs: BlobService
    tenants: TenantStore
    listing: TaskListing
    deletion: TaskDeletion
    tenant_admin: TenantService
    # Issue 11: tenants' secrets (None: DECKHANDS_SECRETS_KEY unset) and what tasks are
    # created with besides their State (secrets they may use, a webhook).
    secrets: SecretsStore | None = None
    attachments: TaskAttachments | None = None
    secrets_refill: SecretsRefill | None = None
    forks: TaskForks | None = None


def quota_defaults(settings: GatewaySettings) -> QuotaDefaults:
    return QuotaDefaults(
        max_running_tasks=settings.tenant_max_running_tasks,
        max_sandboxes=settings.tenant_max_sandboxes,
        max_spend_usd_per_day=settings.tenant_max_spend_usd_per_day,
        max_egress_bytes_per_day=settings.tenant_max_egress_bytes_per_day,
        default_max_budget_usd=settings.default_max_budget_usd,
        max_delegation_depth=settings.max_delegation_depth,
        max_sub_tasks=settings.max_sub_tasks_per_task,
        max_event_streams=settings.max_event_streams_per_tenant,
        allow_trajectory_tasks=settings.allow_trajectory_tasks,
        egress_allow=tuple(settings.egress_allow),
    )


def build_context(settings: GatewaySettings, broker: NatsBroker, redis: Redis) -> GatewayContext:
    store = TaskViews(redis)  # the controller's States, and tasks it has not made yet
    tasks = TaskService(
        store,
        broker,
        defaults=TaskDefaults(
            max_iterations=settings.default_max_iterations,
            confirmation_mode=settings.default_confirmation_mode,
            confirmation_threshold=settings.default_confirmation_threshold,
            network_egress_allowed=settings.allow_network_egress,
            max_workspace_mib=settings.max_workspace_mib,
            egress_presets={
                name: EgressPolicy(allow=tuple(rules))
                for name, rules in settings.egress_presets.items()
            },
        ),
        idempotency_ttl_s=settings.idempotency_ttl_s,
        pool_name=settings.pool_name,
        creations=CreationSlots(settings.max_creations_in_flight, settings.creation_wait_s),
        quota_defaults=quota_defaults(settings),
    )
    history = HistoryClient(
        broker, timeout_s=settings.history_timeout_s, page_size=settings.history_page_size
    )
    events = EventService(
        broker,
        history,
        tasks,
        heartbeat_s=settings.sse_heartbeat_s,
        gap_retry_s=settings.sse_gap_retry_s,
        catch_up_s=settings.history_timeout_s,
        max_streams_per_client=settings.max_event_streams_per_client,
    )
    readiness = ReadinessService(broker, redis, timeout_s=settings.readiness_timeout_s)
    blob_store = BlobStore(lambda: broker.connection.jetstream())
    blobs = BlobService(tasks, blob_store)
    deletion = TaskDeletion(
        tasks, history, broker, blob_store, stop_timeout_s=settings.delete_stop_timeout_s
    )
    # Tenants, keys and limits: durable in NATS key-value, cached in Redis.
    records = TenantRecords(lambda: broker.connection.jetstream())
    tenants = TenantStore(redis, records, max_keys=settings.max_api_keys_per_tenant)
    tasks.quotas.records = records
    # Task owners and Idempotency-Keys: durable there too (Redis may lose them).
    tasks.records.durable = records
    tasks.idempotency.durable = records
    secrets_store = SecretsStore.from_settings(redis, settings)
    webhook_store = WebhookStore(redis)
    secrets_refill = None
    if secrets_store is not None:
        # Durable in NATS key-value; Redis is filled again from there if it loses them.
        secret_records = TenantRecords(lambda: broker.connection.jetstream(), bucket=SECRETS_BUCKET)
        secrets_store.durable = secret_records
        webhook_store.durable = secret_records
        secrets_refill = SecretsRefill(redis, secrets_store, webhook_store, secret_records)
    attachments = TaskAttachments(
        SecretService(secrets_store),
        webhook_store,
        settings.webhook_allow_private_targets,
    )
    tasks.attachments = attachments
    return GatewayContext(
        settings,
        broker,
        redis,
        tasks,
        events,
        readiness,
        blobs,
        tenants,
        TaskListing(store, tasks.records),
        deletion,
        TenantService(tenants, tasks.quotas, tasks),
        secrets=secrets_store,
        attachments=attachments,
        secrets_refill=secrets_refill,
        forks=TaskForks(tasks, history, lambda: broker.connection.jetstream()),
    )


def build_workspace(
    settings: GatewaySettings, broker: NatsBroker, redis: Redis, context: GatewayContext
) -> WorkspaceService:
    """The workspace routes' service; also gives task creation its repository check."""
    context.tasks.repositories = RepositoryCheck(
        redis,
        settings.repository_url_schemes,
        context.secrets,
        settings.repository_allowed_hosts,
    )
    return WorkspaceService(
        context.tasks,
        broker,
        WorkspaceTransfers(lambda: broker.connection.jetstream()),
        timeout_s=settings.workspace_timeout_s,
        max_download_bytes=settings.workspace_max_download_bytes,
    )


def build_deliverer(
    settings: GatewaySettings, broker: NatsBroker, redis: Redis, context: GatewayContext
) -> WebhookDeliverer:
    assert context.attachments is not None
    return WebhookDeliverer(
        lambda: broker.connection.jetstream(),
        context.attachments.webhooks,
        context.secrets,
        context.tasks.store,
        context.tasks.records,
        DeliveryPolicy(
            timeout_s=settings.webhook_timeout_s,
            backoff_s=settings.webhook_backoff_s,
            backoff_max_s=settings.webhook_backoff_max_s,
            deadline_s=settings.webhook_deadline_s,
            max_attempts=settings.webhook_max_attempts,
            allow_private=settings.webhook_allow_private_targets,
            concurrency=settings.webhook_concurrency,
        ),
        lambda: broker.connection.is_connected,
    )


# The dependencies are coroutines: FastAPI runs a plain `def` dependency on a worker thread,
# two thread hops per request for what is an attribute lookup.
async def get_context(request: Request) -> GatewayContext:
    context = getattr(request.app.state, "gateway", None)
    if not isinstance(context, GatewayContext):
        raise RuntimeError("the gateway has not started (its lifespan did not run)")
    return context


async def _tasks(context: Annotated[GatewayContext, Depends(get_context)]) -> TaskService:
    return context.tasks


async def _events(context: Annotated[GatewayContext, Depends(get_context)]) -> EventService:
    return context.events


async def _readiness(context: Annotated[GatewayContext, Depends(get_context)]) -> ReadinessService:
    return context.readiness


async def _blobs(context: Annotated[GatewayContext, Depends(get_context)]) -> BlobService:
    return context.blobs


async def _tenants(context: Annotated[GatewayContext, Depends(get_context)]) -> TenantStore:
    return context.tenants


async def _quotas(context: Annotated[GatewayContext, Depends(get_context)]) -> TenantQuotas:
    return context.tasks.quotas


async def _listing(context: Annotated[GatewayContext, Depends(get_context)]) -> TaskListing:
    return context.listing


async def _deletion(context: Annotated[GatewayContext, Depends(get_context)]) -> TaskDeletion:
    return context.deletion


TaskServiceDep = Annotated[TaskService, Depends(_tasks)]
BlobServiceDep = Annotated[BlobService, Depends(_blobs)]
EventServiceDep = Annotated[EventService, Depends(_events)]
ReadinessServiceDep = Annotated[ReadinessService, Depends(_readiness)]
TenantStoreDep = Annotated[TenantStore, Depends(_tenants)]
TaskListingDep = Annotated[TaskListing, Depends(_listing)]
TenantQuotasDep = Annotated[TenantQuotas, Depends(_quotas)]
TaskDeletionDep = Annotated[TaskDeletion, Depends(_deletion)]


async def _forks(context: Annotated[GatewayContext, Depends(get_context)]) -> TaskForks:
    assert context.forks is not None  # build_context makes it
    return context.forks


TaskForksDep = Annotated[TaskForks, Depends(_forks)]


async def _tenant_admin(context: Annotated[GatewayContext, Depends(get_context)]) -> TenantService:
    return context.tenant_admin


TenantServiceDep = Annotated[TenantService, Depends(_tenant_admin)]
