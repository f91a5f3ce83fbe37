"""Wiring of the runtime-executor: settings, broker, the subscribers, start-up and shutdown."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream
from faststream.nats import NatsBroker

from shared.blobs import BlobStore
from shared.broker import DELETIONS, ROUTED, WORK, build_broker, durable_subscription
from shared.broker_permissions import inbox_prefix
from shared.commands import ExecuteAction, PrepareSandbox
from shared.event_loop import run
from shared.events import (
    CmdOutputObservation,
    ErrorObservation,
    EventBase,
    FileReadObservation,
    FileWriteObservation,
    PythonOutputObservation,
    SandboxQueuedObservation,
    WorkspaceCheckpointObservation,
    new_id,
)
from shared.periodic import every
from shared.publishing import publish_event_to, publish_json
from shared.shutdown import bound_shutdown
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import WORK_STREAM, Service, deletion_subject, routed_subject, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing
from shared.workspace import WORKSPACE_SUBJECT, WorkspaceRequest, WorkspaceTransfers

from .checkpoint_store import CheckpointStore
from .containers import DockerSandboxes
from .handlers import RuntimeHandlers, RuntimeWork
from .routing import QUEUE_INACTIVE_S, ReplicaQueues, consumer_name
from .service import Engine, RuntimeService
from .settings import RuntimeSettings

__all__ = ["build_app", "build_runtime", "main"]

log = logging.getLogger("deckhands.runtime")


def build_app(settings: RuntimeSettings | None = None) -> FastStream:
    return build_runtime(settings)[0]


def build_runtime(
    settings: RuntimeSettings | None = None, engine: Engine = DockerSandboxes
) -> tuple[FastStream, RuntimeService]:
    """The app and its service (tests and the benchmark reach into the service); `engine`
    makes its container engine (Docker's; the unit tests' fake)."""
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

    service = RuntimeService(
        settings,
        publish,
        resend,
        BlobStore(lambda: broker.connection.jetstream()),
        WorkspaceTransfers(lambda: broker.connection.jetstream()),
        engine,
        CheckpointStore(lambda: broker.connection.jetstream()),
    )
    queues = ReplicaQueues(
        broker,
        lambda: broker.connection.jetstream(),
        service.replica,
        settings.replica_ttl_s,
        settings.ack_wait_s,
        f"{inbox_prefix(settings.nats_user)}.".encode() if settings.nats_user else None,
    )
    handlers = RuntimeHandlers(
        broker,
        settings,
        queues,
        service.execution,
        service.seating,
        service.workspace,
        service.tasks,
        service.checkouts,
    )
    _subscribe(broker, settings, handlers, service.replica)
    _declare_sends(broker)

    app = FastStream(broker)
    bound_shutdown(app, settings.shutdown_timeout_s)
    _run_with(app, settings, service, queues)
    return app, service


def _run_with(
    app: FastStream, settings: RuntimeSettings, service: RuntimeService, queues: ReplicaQueues
) -> None:
    """Start the service with the app, watch for gone replicas while it runs, stop it after."""
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


def _subscribe(
    broker: NatsBroker, settings: RuntimeSettings, handlers: RuntimeHandlers, replica: str
) -> None:
    """The runtime's receivers: workspace requests (the shared subject and this replica's), and
    work orders (the shared queue and this replica's own)."""
    broker.subscriber(
        WORKSPACE_SUBJECT,
        queue="runtime",
        max_workers=16,
        title="runtime.workspace",
        description="Request/reply: a task's workspace in and out (a tree, a file, a diff, "
        "an upload); the bytes travel as transfer objects in the blob store.",
    )(handlers.on_workspace)
    broker.subscriber(
        f"{WORKSPACE_SUBJECT}.{replica}",
        queue="runtime",
        max_workers=16,
        title="runtime.workspace.replica",
        description="Request/reply: a workspace request passed on by another replica to the "
        "replica holding the task's sandbox (this one: the subject names the replica).",
    )(handlers.on_own_workspace)
    broker.subscriber(
        deletion_subject("*"),
        title="runtime.deletions",
        description="A deleted task: what its checkout recorded (commit, instructions) is "
        "removed (one consumer shared by the replicas).",
        **durable_subscription(settings, DELETIONS, "runtime"),
    )(handlers.on_deletion)
    broker.subscriber(
        work_subject(Service.RUNTIME),
        title="runtime.work",
        description="Approved actions to run in the task's sandbox (ExecuteAction), "
        "PrepareSandbox with a task's first step, and ReleaseSandbox when a task ends, one "
        "subject per task.",
        **durable_subscription(settings, WORK, "runtime", workers=settings.workers),
    )(handlers.on_work)
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
    )(handlers.on_routed)


def _declare_sends(broker: NatsBroker) -> None:
    """The runtime's sends, declared for the AsyncAPI document; publishing goes through
    shared.publishing."""
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="runtime.observations",
        description="The observation answering each executed action (cause = the action id), "
        "and the checkpoint of the workspace after it (issue 28).",
        schema=CmdOutputObservation
        | PythonOutputObservation
        | FileReadObservation
        | FileWriteObservation
        | ErrorObservation
        | SandboxQueuedObservation
        | WorkspaceCheckpointObservation,
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


def main() -> None:
    settings = settings_or_exit(RuntimeSettings, "runtime")
    setup_logging(settings, "runtime")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
