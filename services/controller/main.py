"""Wiring of the controller: settings, Redis, broker, subscriber, telemetry."""

from __future__ import annotations

import asyncio

from faststream import FastStream

from shared.broker import NOTICES, WORK, build_broker, durable_subscription
from shared.event_loop import run
from shared.events import AgentStateChangedObservation, AnswerMissingObservation
from shared.redis_client import connect_redis
from shared.secrets_store import SecretsStore
from shared.state_store import TaskStateStore
from shared.streams import ensure_streams
from shared.subjects import Service, notice_subject, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing

from .deadlines import AnswerDeadlines
from .handlers import ControllerHandlers
from .secret_filter import SecretFilter
from .settings import ControllerSettings
from .state_cache import StateCache
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
    )
    broker.subscriber(
        work_subject(Service.CONTROLLER),
        title="controller.inbox",
        description="User input, agent actions, verdicts and observations of every task.",
        **durable_subscription(settings, WORK, "controller", workers=settings.workers),
    )(handlers.on_input)

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

    app = FastStream(broker)
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


def main() -> None:
    settings = ControllerSettings()
    setup_logging(settings, "controller")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
