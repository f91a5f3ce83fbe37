"""JetStream streams: declared by `python -m tools.streams` (an admin's step), checked by every
service at start-up.

`ensure_streams` creates a missing stream and updates one whose config differs, and does
nothing to one that is as declared: a service whose NATS user may not manage streams passes
when the streams are there, and fails with the server's refusal when they are not.
"""

from __future__ import annotations

import nats
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BucketNotFoundError, NotFoundError

from .blobs import ensure_blob_bucket
from .broker_permissions import ADMIN_USER, inbox_prefix
from .settings import CommonSettings
from .subjects import (
    CHECKPOINTS_BUCKET,
    DELETIONS_STREAM,
    DLQ_STREAM,
    EVENTS_STREAM,
    NOTICES_STREAM,
    ROUTED_STREAM,
    SECRETS_BUCKET,
    TENANTS_BUCKET,
    WORK_STREAM,
)

__all__ = ["ensure_secrets_bucket", "ensure_streams", "ensure_tenants_bucket", "stream_configs"]

_DAY_S = 86_400.0
# Long enough to cover a publisher's retries after a lost ack; Nats-Msg-Id dedups within it.
_DUPLICATE_WINDOW_S = 300.0


def stream_configs(settings: CommonSettings) -> list[StreamConfig]:
    max_age = settings.stream_max_age_days * _DAY_S
    return [
        StreamConfig(
            name=EVENTS_STREAM,
            description="Every task's event log; the source of truth.",
            subjects=["deckhands.events.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            discard=DiscardPolicy.OLD,
            num_replicas=settings.stream_replicas,
        ),
        StreamConfig(
            name=WORK_STREAM,
            description="Work orders between services; removed once acknowledged.",
            subjects=["deckhands.work.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            num_replicas=settings.stream_replicas,
        ),
        StreamConfig(
            name=ROUTED_STREAM,
            description="Work orders for one replica of a service (the runtime replica whose "
            "engine holds the task's sandbox); removed once acknowledged.",
            subjects=["deckhands.routed.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            num_replicas=settings.stream_replicas,
        ),
        StreamConfig(
            name=DLQ_STREAM,
            description="Messages a service gave up on, with the reason in headers.",
            subjects=["deckhands.dlq.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            num_replicas=settings.stream_replicas,
        ),
        StreamConfig(
            name=NOTICES_STREAM,
            description="Tasks' state changes for webhook delivery; removed once acknowledged.",
            subjects=["deckhands.notices.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            num_replicas=settings.stream_replicas,
        ),
        StreamConfig(
            name=DELETIONS_STREAM,
            description="Deleted tasks: every storage replica removes its copy of their events, "
            "one that was down when it is back.",
            subjects=["deckhands.deletions.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
            num_replicas=settings.stream_replicas,
        ),
    ]


# The fields stream_configs sets: a stream that has these as declared needs no update.
_DECLARED_FIELDS = (
    "subjects",
    "retention",
    "storage",
    "max_age",
    "duplicate_window",
    "discard",
    "num_replicas",
    "description",
)


def _as_declared(current: StreamConfig, wanted: StreamConfig) -> bool:
    return all(
        getattr(wanted, name) is None or getattr(current, name) == getattr(wanted, name)
        for name in _DECLARED_FIELDS
    )


async def ensure_tenants_bucket(js: JetStreamContext, replicas: int = 1) -> None:
    """The gateway's durable record of tenants, API key hashes and limits (Redis caches it):
    a key-value bucket replicated like the streams. Created unless it exists."""
    try:
        await js.key_value(TENANTS_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        await js.create_key_value(
            KeyValueConfig(
                bucket=TENANTS_BUCKET,
                description="Tenants, API key hashes and limits: the source of truth.",
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
            )
        )


async def ensure_secrets_bucket(js: JetStreamContext, replicas: int = 1) -> None:
    """The durable copy of tenants' secrets (sealed) and tasks' grants, from which the gateway
    fills a Redis that lost its data (services/gateway/secrets/records.py)."""
    try:
        await js.key_value(SECRETS_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        await js.create_key_value(
            KeyValueConfig(
                bucket=SECRETS_BUCKET,
                description="Tenants' secrets (AES-GCM sealed) and tasks' grants.",
                history=1,
                storage=StorageType.FILE,
                replicas=replicas,
            )
        )


async def ensure_streams(settings: CommonSettings) -> None:
    """Create the streams, or bring an existing one's config up to date."""
    login: dict[str, str] = {}
    if settings.nats_user:
        login = {
            "user": settings.nats_user,
            "password": settings.nats_password.get_secret_value(),
            "inbox_prefix": inbox_prefix(settings.nats_user),
        }
    nc = await nats.connect(
        servers=settings.nats_servers, connect_timeout=5, max_reconnect_attempts=3, **login
    )
    try:
        js = nc.jetstream()
        for config in stream_configs(settings):
            assert config.name is not None
            try:
                info = await js.stream_info(config.name)
            except NotFoundError:
                await js.add_stream(config)
            else:
                if not _as_declared(info.config, config):
                    await js.update_stream(config)
        await ensure_blob_bucket(js, settings.blob_store_max_bytes, settings.stream_replicas)
        await ensure_blob_bucket(
            js,
            settings.checkpoint_store_max_bytes,
            settings.stream_replicas,
            CHECKPOINTS_BUCKET,
            "Tasks' workspace checkpoints: files by content, and each checkpoint's manifest.",
        )
        await ensure_tenants_bucket(js, settings.stream_replicas)
        await ensure_secrets_bucket(js, settings.stream_replicas)
        if settings.nats_user in ("", ADMIN_USER):  # services may not delete consumers
            await _retire_consumers(js)
    finally:
        await nc.close()


# Durable consumers an earlier version made and no service reads any more: left, each would
# hold its stream's messages as pending for ever (and trip the pending-growing alert).
RETIRED_CONSUMERS = (
    # Webhooks read every event of the log until they got the notices stream of their own.
    (EVENTS_STREAM, "webhooks"),
)


async def _retire_consumers(js: JetStreamContext) -> None:
    for stream, durable in RETIRED_CONSUMERS:
        try:
            await js.delete_consumer(stream, durable)
        except NotFoundError:
            continue
