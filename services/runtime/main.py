"""Wiring of the runtime-executor: settings, broker, the work subscriber, start-up and shutdown."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

from faststream import FastStream
from pydantic import Field

from shared.blobs import BlobStore
from shared.broker import ROUTED, WORK, build_broker, durable_subscription, handled_message
from shared.broker_permissions import inbox_prefix
from shared.commands import ExecuteAction, PrepareSandbox, ReleaseSandbox
from shared.event_loop import run
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
from shared.periodic import every
from shared.publishing import publish_event_to, publish_json
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import WORK_STREAM, Service, routed_subject, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing
from shared.workspace import (
    WORKSPACE_SUBJECT,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceTransfers,
)

from .errors import HeldElsewhere
from .handlers import RuntimeService
from .routing import QUEUE_INACTIVE_S, ReplicaQueues, consumer_name, relay_id
from .settings import RuntimeSettings

__all__ = ["RuntimeWork", "build_app", "build_runtime", "main"]

log = logging.getLogger("deckhands.runtime")

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

    async def resend(order: ExecuteAction | PrepareSandbox) -> None:
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
    replica = service.replica
    queues = ReplicaQueues(
        broker,
        lambda: broker.connection.jetstream(),
        replica,
        settings.replica_ttl_s,
        settings.ack_wait_s,
        f"{inbox_prefix(settings.nats_user)}.".encode() if settings.nats_user else None,
    )

    async def pass_on(order: RuntimeWork, to: str) -> None:
        """The task's sandbox is on the engine of replica `to`, alive: the order is its."""
        meta = handled_message(broker).raw_message.metadata
        msg_id = relay_id(order.id, meta.stream, meta.sequence.stream)
        await queues.forward(order.task_id, order.model_dump_json(), to, msg_id)
        log.info("task %s: %s passed on to runtime replica %s", order.task_id, order.kind, to)

    async def handle(body: RuntimeWork) -> None:
        try:
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
        except HeldElsewhere as elsewhere:
            await pass_on(body, elsewhere.replica)

    @broker.subscriber(
        WORKSPACE_SUBJECT,
        queue="runtime",
        max_workers=16,
        title="runtime.workspace",
        description="Request/reply: a task's workspace in and out (a tree, a file, a diff, "
        "an upload); the bytes travel as transfer objects in the blob store.",
    )
    async def on_workspace(body: WorkspaceRequest) -> WorkspaceReply:
        holder = await service.tasks.held_elsewhere(body.task_id)
        if holder is None:
            try:
                return await service.workspace.handle(body)
            except HeldElsewhere as elsewhere:
                holder = elsewhere.replica
        # The sandbox is on that replica's engine: it answers (the gateway's request is bounded
        # by the gateway's own timeout).
        reply = await broker.request(
            body.model_dump_json().encode(),
            f"{WORKSPACE_SUBJECT}.{holder}",
            timeout=settings.workspace_forward_timeout_s,
        )
        return WorkspaceReply.model_validate_json(reply.body)

    @broker.subscriber(
        f"{WORKSPACE_SUBJECT}.{replica}",
        queue="runtime",
        max_workers=16,
        title="runtime.workspace.replica",
        description="Request/reply: a workspace request passed on by another replica to the "
        "replica holding the task's sandbox (this one: the subject names the replica).",
    )
    async def on_own_workspace(body: WorkspaceRequest) -> WorkspaceReply:
        return await service.workspace.handle(body)

    async def on_work(body: RuntimeWork) -> None:
        await handle(body)

    async def on_routed(body: RuntimeWork) -> None:
        await handle(body)

    broker.subscriber(
        work_subject(Service.RUNTIME),
        title="runtime.work",
        description="Approved actions to run in the task's sandbox (ExecuteAction), "
        "PrepareSandbox with a task's first step, and ReleaseSandbox when a task ends, one "
        "subject per task.",
        **durable_subscription(settings, WORK, "runtime", workers=settings.workers),
    )(on_work)
    broker.subscriber(
        routed_subject(Service.RUNTIME, replica),
        title="runtime.work.replica",
        description="The orders of tasks whose sandbox this replica's engine holds (the "
        "subject names the replica): the same orders as runtime.work. A replica gone for "
        "good has its queue handed back to runtime.work by the others.",
        **durable_subscription(
            settings,
            ROUTED,
            consumer_name(replica),
            workers=settings.workers,
            inactive_s=QUEUE_INACTIVE_S,
        ),
    )(on_routed)

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
        description="A queued task's ExecuteAction, sent again once a seat freed for it; and "
        "the orders queued for a replica that is gone, handed back to every replica.",
        schema=ExecuteAction,
    )
    broker.publisher(
        routed_subject(Service.RUNTIME, "*"),
        stream=ROUTED,
        title="runtime.passed_on",
        description="An order passed on to the replica whose engine holds the task's sandbox.",
        schema=RuntimeWork,
    )
    broker.publisher(
        f"{WORKSPACE_SUBJECT}.*",
        title="runtime.workspace_passed_on",
        description="Request/reply: a workspace request passed on to the replica whose engine "
        "holds the task's sandbox (the subject names that replica).",
        schema=WorkspaceRequest,
    )

    app = FastStream(broker)
    background: list[asyncio.Task[None]] = []

    @app.on_startup
    async def _start() -> None:
        setup_metrics(settings)
        await ensure_streams(settings)
        await service.start()

    @app.after_startup
    async def _watch_replicas() -> None:
        background.append(
            asyncio.create_task(
                every(
                    settings.replica_ttl_s / 3,
                    lambda: queues.drain_gone(service.bindings),
                    "handing back the orders of gone replicas",
                    log,
                ),
                name="runtime-gone-replicas",
            )
        )

    @app.on_shutdown
    async def _unwatch() -> None:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)

    @app.after_shutdown
    async def _stop() -> None:
        await service.stop()

    return app, service


def main() -> None:
    settings = settings_or_exit(RuntimeSettings, "runtime")
    setup_logging(settings, "runtime")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
