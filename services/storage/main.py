"""Wiring of the storage service: the event-log consumer and the history responder."""

from __future__ import annotations

from faststream import FastStream
from faststream.nats.message import NatsBatchMessage

from shared.broker import DELETIONS, EVENTS, build_broker, durable_subscription, handled_message
from shared.commands import HistoryReply
from shared.event_loop import run
from shared.shutdown import bound_shutdown
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import (
    FORGET_SUBJECT,
    HISTORY_SUBJECT,
    Service,
    deletion_subject,
    event_subject,
)
from shared.telemetry import setup_logging, setup_metrics, setup_tracing

from .event_log import EventLog
from .handlers import StorageHandlers
from .settings import StorageSettings

__all__ = ["build_app", "main"]


def build_app(settings: StorageSettings | None = None) -> FastStream:
    settings = settings or StorageSettings()
    broker = build_broker(settings, Service.STORAGE, setup_tracing(settings, "storage"))
    log = EventLog(settings.data_dir / f"{settings.replica}.sqlite3")
    # NATS' default max_payload until the server's own is known (after connecting).
    handlers = StorageHandlers(log, max_reply_bytes=1024 * 1024)

    async def on_events() -> None:
        batch: NatsBatchMessage = handled_message(broker)
        await handlers.on_events(batch.raw_message, broker.guard, broker)

    broker.subscriber(
        event_subject("*"),
        title="storage.events",
        description="Persists every logged event of every task (in batches).",
        **durable_subscription(
            settings,
            EVENTS,
            settings.replica,
            batch_size=settings.batch_size,
            batch_wait_s=settings.batch_wait_s,
            inactive_s=settings.consumer_inactive_s,
        ),
    )(on_events)

    @broker.subscriber(
        HISTORY_SUBJECT,
        queue="storage",
        title="storage.history",
        description="Request/reply: a task's events after a seq, in order.",
    )
    async def on_history() -> HistoryReply:
        # The raw body: a malformed request is answered with what was wrong, not dropped.
        return await handlers.on_history(handled_message(broker).body)

    broker.subscriber(
        deletion_subject("*"),
        title="storage.deletions",
        description="A deleted task: every replica removes its copy of the task's events, one "
        "that was down when the task was deleted once it is back.",
        **durable_subscription(
            settings, DELETIONS, settings.replica, inactive_s=settings.consumer_inactive_s
        ),
    )(handlers.on_deletion)
    broker.subscriber(
        FORGET_SUBJECT,  # no queue group: every replica keeps a copy, every one removes it
        title="storage.forget",
        description="Request/reply: remove a deleted task's events.",
    )(handlers.on_forget)

    app = FastStream(broker)
    bound_shutdown(app, settings.shutdown_timeout_s)

    @app.on_startup
    async def _start() -> None:
        setup_metrics(settings)
        await log.open()
        await ensure_streams(settings)

    @app.after_startup
    async def _learn_max_payload() -> None:
        handlers.max_reply_bytes = broker.connection.max_payload

    @app.after_shutdown
    async def _stop() -> None:
        await log.close()

    return app


def main() -> None:
    settings = settings_or_exit(StorageSettings, "storage")
    setup_logging(settings, "storage")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
