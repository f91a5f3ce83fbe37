"""Wiring of the runtime-executor: settings, broker, the work subscriber, start-up and shutdown."""

from __future__ import annotations

import asyncio
from typing import Annotated

from faststream import FastStream
from pydantic import Field

from shared.blobs import BlobStore
from shared.broker import WORK, build_broker, durable_subscription, handled_message
from shared.commands import ExecuteAction, PrepareSandbox, ReleaseSandbox
from shared.events import (
    CmdOutputObservation,
    ErrorObservation,
    EventBase,
    FileReadObservation,
    FileWriteObservation,
    PythonOutputObservation,
    SandboxQueuedObservation,
    new_id,
)
from shared.publishing import publish_event_to, publish_json
from shared.streams import ensure_streams
from shared.subjects import WORK_STREAM, Service, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing
from shared.workspace import (
    WORKSPACE_SUBJECT,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceTransfers,
)

from .handlers import RuntimeService
from .settings import RuntimeSettings

__all__ = ["RuntimeWork", "build_app", "build_runtime", "main"]

RuntimeWork = Annotated[
    ExecuteAction | PrepareSandbox | ReleaseSandbox, Field(discriminator="kind")
]


def build_app(settings: RuntimeSettings | None = None) -> FastStream:
    return build_runtime(settings)[0]


def build_runtime(settings: RuntimeSettings | None = None) -> tuple[FastStream, RuntimeService]:
    """The app and its service (tests and the benchmark reach into the service)."""
    settings = settings or RuntimeSettings()
    broker = build_broker(settings, Service.RUNTIME, setup_tracing(settings, "runtime"))

    async def publish(event: EventBase) -> None:
        await publish_event_to(broker, Service.CONTROLLER, event)

    async def resend(order: ExecuteAction) -> None:
        # A new message id: the first copy was delivered (and acked) when the task queued.
        await publish_json(
            broker,
            work_subject(Service.RUNTIME, order.task_id),
            order.model_dump_json(),
            f"{order.id}.seated.{new_id()}",
            WORK_STREAM,
        )

    blobs = BlobStore(lambda: broker.connection.jetstream())
    service = RuntimeService(settings, publish, resend, blobs)
    service.workspace.transfers = WorkspaceTransfers(lambda: broker.connection.jetstream())

    @broker.subscriber(
        WORKSPACE_SUBJECT,
        queue="runtime",
        max_workers=16,
        title="runtime.workspace",
        description="Request/reply: a task's workspace in and out (a tree, a file, a diff, "
        "an upload); the bytes travel as transfer objects in the blob store.",
    )
    async def on_workspace(body: WorkspaceRequest) -> WorkspaceReply:
        return await service.workspace.handle(body)

    @broker.subscriber(
        work_subject(Service.RUNTIME),
        title="runtime.work",
        description="Approved actions to run in the task's sandbox (ExecuteAction), "
        "PrepareSandbox with a task's first step, and ReleaseSandbox when a task ends, one "
        "subject per task.",
        **durable_subscription(settings, WORK, "runtime", workers=settings.workers),
    )
    async def on_work(body: RuntimeWork) -> None:
        if isinstance(body, ReleaseSandbox):
            await service.release(body)
            return
        if isinstance(body, PrepareSandbox):
            await service.prepare(body)
            return
        msg = handled_message(broker)
        delivered = msg.raw_message.metadata.num_delivered
        await service.execute(
            body, progress=msg.in_progress, last_try=delivered >= settings.max_deliveries
        )

    # Declared for the AsyncAPI document; publishing goes through shared.publishing.
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="runtime.observations",
        description="The observation answering each executed action (cause = the action id).",
        schema=CmdOutputObservation
        | PythonOutputObservation
        | FileReadObservation
        | FileWriteObservation
        | ErrorObservation
        | SandboxQueuedObservation,
    )
    broker.publisher(
        work_subject(Service.RUNTIME, "*"),
        stream=WORK,
        title="runtime.admitted",
        description="A queued task's ExecuteAction, sent again once a seat freed for it.",
        schema=ExecuteAction,
    )

    app = FastStream(broker)

    @app.on_startup
    async def _start() -> None:
        setup_metrics(settings)
        await ensure_streams(settings)
        await service.start()

    @app.after_shutdown
    async def _stop() -> None:
        await service.stop()

    return app, service


def main() -> None:
    settings = RuntimeSettings()
    setup_logging(settings, "runtime")
    asyncio.run(build_app(settings).run())


if __name__ == "__main__":
    main()
