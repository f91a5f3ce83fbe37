"""Wiring of the controller: settings, Redis, broker, subscriber, telemetry."""

from __future__ import annotations

import asyncio

from faststream import FastStream
from faststream.nats import NatsBroker

from shared.broker import (
    DELETIONS,
    EVENTS,
    NOTICES,
    ROUTED,
    WORK,
    build_broker,
    durable_subscription,
)
from shared.commands import (
    CheckpointWorkspace,
    ExecuteAction,
    PrepareSandbox,
    ReleaseSandbox,
    ReviewAction,
    StepRequest,
)
from shared.event_loop import run
from shared.events import AgentStateChangedObservation, AnswerMissingObservation, Event
from shared.redis_client import connect_redis
from shared.secrets_store import SecretsStore
from shared.shutdown import bound_shutdown
from shared.startup import settings_or_exit
from shared.state_store import TaskStateStore
from shared.streams import ensure_streams
from shared.subjects import (
    Service,
    deletion_subject,
    event_subject,
    notice_subject,
    routed_subject,
    work_subject,
)
from shared.telemetry import setup_logging, setup_metrics, setup_tracing

from .deadlines import AnswerDeadlines
from .handlers import ControllerHandlers
from .secret_filter import SecretFilter
from .settings import ControllerSettings
from .state_cache import StateCache
from .stuck import LoopPolicy
from .task_log import TaskLog

__all__ = ["build_app", "main"]


def build_app(settings: ControllerSettings | None = None) -> FastStream:
    settings = settings or ControllerSettings()
    broker = build_broker(settings, Service.CONTROLLER, setup_tracing(settings, "controller"))
    redis = connect_redis(settings.redis_url, settings)
    handlers = ControllerHandlers(
        broker,
        TaskStateStore(redis),
        settings.cas_attempts,
        AnswerDeadlines.from_settings(settings),
        settings.answer_retries,
        StateCache(settings.state_cache_size),
        TaskLog(lambda: broker.config.connection_state.stream),
        SecretFilter(SecretsStore.from_settings(redis, settings)),
        LoopPolicy(settings.loop_repeats, settings.loop_hints),
    )
    broker.subscriber(
        work_subject(Service.CONTROLLER),
        title="controller.inbox",
        description="User input, agent actions, verdicts and observations of every task.",
        **durable_subscription(settings, WORK, "controller", workers=settings.workers),
    )(handlers.on_input)
    broker.subscriber(
        deletion_subject("*"),
        title="controller.deletions",
        description="A deleted task: its State and deadline are removed (one consumer shared "
        "by the replicas).",
        **durable_subscription(settings, DELETIONS, "controller"),
    )(handlers.on_deletion)

    _declare_sends(broker)

    app = FastStream(broker)
    bound_shutdown(app, settings.shutdown_timeout_s)
    sweeper: list[asyncio.Task[None]] = []

    @app.on_startup
    async def _start() -> None:
        setup_metrics(settings)
        await redis.ping()
        await ensure_streams(settings)

    @app.after_startup
    async def _watch() -> None:
        sweeper.append(asyncio.create_task(handlers.watch_deadlines(settings.deadline_poll_s)))
        # Same pace: a task whose State Redis lost waits for it no longer than for a deadline.
        sweeper.append(asyncio.create_task(handlers.watch_lost_states(settings.deadline_poll_s)))

    @app.on_shutdown
    async def _unwatch() -> None:
        for task in sweeper:
            task.cancel()
        await asyncio.gather(*sweeper, return_exceptions=True)

    @app.after_shutdown
    async def _stop() -> None:
        await redis.aclose()

    return app


def _declare_sends(broker: NatsBroker) -> None:
    """The controller's sends, declared for the AsyncAPI document: a turn publishes what it
    decided through turn.py, which adds the Nats-Msg-Id."""
    broker.publisher(
        event_subject("*"),
        stream=EVENTS,
        title="controller.log",
        description="The task's log: every event the controller accepted, in order, one "
        "subject per task (storage keeps it; the gateway streams it live).",
        schema=Event,
    )
    broker.publisher(
        work_subject(Service.REASONER, "*"),
        stream=WORK,
        title="controller.steps",
        description="A StepRequest when the task needs its next action from the LLM.",
        schema=StepRequest,
    )
    broker.publisher(
        work_subject(Service.SECURITY, "*"),
        stream=WORK,
        title="controller.reviews",
        description="A ReviewAction for a runnable action the controller holds (a user's "
        "command, or one confirmed or resumed), before it is run.",
        schema=ReviewAction,
    )
    broker.publisher(
        work_subject(Service.RUNTIME, "*"),
        stream=WORK,
        title="controller.orders",
        description="ExecuteAction for an approved action, PrepareSandbox with a task's first "
        "step, ReleaseSandbox when it ends, CheckpointWorkspace after an upload: to any "
        "runtime replica while no replica holds the task's sandbox.",
        schema=ExecuteAction | PrepareSandbox | ReleaseSandbox | CheckpointWorkspace,
    )
    broker.publisher(
        routed_subject(Service.RUNTIME, "*"),
        stream=ROUTED,
        title="controller.routed_orders",
        description="The same orders, to the runtime replica whose engine holds the task's "
        "sandbox.",
        schema=ExecuteAction | PrepareSandbox | ReleaseSandbox | CheckpointWorkspace,
    )
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="controller.overdue",
        description="An AnswerMissingObservation (why=overdue) into the task's own inbox when an "
        "awaited answer passed its deadline: the controller asks again, then ends the task in "
        "ERROR naming what did not answer.",
        schema=AnswerMissingObservation,
    )

    broker.publisher(
        notice_subject("*"),
        stream=NOTICES,
        title="controller.notices",
        description="Each state change of a task (as logged), copied for the gateway's webhook "
        "delivery: a few messages per task instead of every event of the log.",
        schema=AgentStateChangedObservation,
    )


def main() -> None:
    settings = settings_or_exit(ControllerSettings, "controller")
    setup_logging(settings, "controller")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
