"""JetStream streams: declared once at start-up by every service, idempotently."""

from __future__ import annotations

import nats
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from .blobs import ensure_blob_bucket
from .settings import CommonSettings
from .subjects import DLQ_STREAM, EVENTS_STREAM, WORK_STREAM

__all__ = ["ensure_streams", "stream_configs"]

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
        ),
        StreamConfig(
            name=WORK_STREAM,
            description="Work orders between services; removed once acknowledged.",
            subjects=["deckhands.work.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
        ),
        StreamConfig(
            name=DLQ_STREAM,
            description="Messages a service gave up on, with the reason in headers.",
            subjects=["deckhands.dlq.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age,
            duplicate_window=_DUPLICATE_WINDOW_S,
        ),
    ]


async def ensure_streams(settings: CommonSettings) -> None:
    """Create the streams, or bring an existing one's config up to date."""
    nc = await nats.connect(settings.nats_url, connect_timeout=5, max_reconnect_attempts=3)
    try:
        js = nc.jetstream()
        for config in stream_configs(settings):
            assert config.name is not None
            try:
                await js.stream_info(config.name)
            except NotFoundError:
                await js.add_stream(config)
            else:
                await js.update_stream(config)
        await ensure_blob_bucket(js, settings.blob_store_max_bytes)
    finally:
        await nc.close()
