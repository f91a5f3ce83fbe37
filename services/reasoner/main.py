"""Wiring of the reasoner: settings, broker, subscriber, LLM client, telemetry."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from shared.blobs import BlobStore
from shared.broker import WORK, build_broker, durable_subscription
from shared.commands import HistoryRequest, ReviewAction
from shared.event_loop import run
from shared.periodic import every
from shared.redis_client import connect_redis
from shared.shutdown import bound_shutdown
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import HISTORY_SUBJECT, Service, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing

from .handlers import StepHandler
from .llm import LLMClient
from .mcp_listing import McpOffer
from .replies import ReasonerMessage
from .settings import ReasonerSettings
from .tools import withhold_tools

log = logging.getLogger("deckhands.reasoner")

__all__ = ["build_app", "main"]


def build_app(settings: ReasonerSettings | None = None) -> FastStream:
    settings = settings or ReasonerSettings()
    broker = build_broker(settings, Service.REASONER, setup_tracing(settings, "reasoner"))
    llm = LLMClient(settings)
    blobs = BlobStore(lambda: broker.connection.jetstream())
    handler = StepHandler(broker, settings, llm, blobs=blobs)
    broker.subscriber(
        work_subject(Service.REASONER),
        title="reasoner.step",
        description="Decides the task's next action with the LLM; answers the controller with "
        "one Action, or an ErrorObservation when the reply was not a valid action.",
        **durable_subscription(settings, WORK, "reasoner", workers=settings.workers),
    )(handler.on_step)
    # Declared for the AsyncAPI document only: the handler publishes through shared.publishing,
    # which adds the Nats-Msg-Id.
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="reasoner.actions",
        description="The one event answering each step (cause = the step request id): an "
        "Action that runs nothing (a runnable one goes by way of the security monitor, "
        "reasoner.reviews), a CondensationAction when the prompt had to be condensed first, or an "
        "ErrorObservation (error_code bad_llm_reply or llm_error). Before it, while the LLM call "
        "waits out a rate limit: a ChangeAgentStateAction (source SYSTEM, agent_state "
        "RATE_LIMITED, same cause) per attempt.",
        schema=ReasonerMessage,
    )
    broker.publisher(
        work_subject(Service.SECURITY, "*"),
        stream=WORK,
        title="reasoner.reviews",
        description="A runnable action answering a step, sent to the security monitor, which "
        "passes it on to the controller with its verdict (a ReviewedAction).",
        schema=ReviewAction,
    )
    broker.publisher(
        HISTORY_SUBJECT,
        title="reasoner.history_query",
        description="Request/reply with the storage service, answered with a HistoryReply.",
        schema=HistoryRequest,
    )

    app = FastStream(broker)
    bound_shutdown(app, settings.shutdown_timeout_s)
    withhold_tools(settings.agent_withheld_tools)
    mcp = McpOffer(settings.mcp_servers)
    retrying: list[asyncio.Task[None]] = []

    @app.on_startup
    async def _start() -> None:
        settings.require_llm()
        setup_metrics(settings)
        await ensure_streams(settings)
        # Trajectories to replay are in Redis; a reasoner that cannot reach it must not start
        # and then quietly call the LLM for a task that should have been replayed.
        redis = connect_redis(settings.redis_url, settings)
        try:
            await redis.ping()
        except Exception as exc:
            await redis.aclose()
            raise RuntimeError(f"cannot reach Redis (DECKHANDS_REDIS_URL): {exc}") from exc
        handler.attach(redis)
        llm.attach(redis)  # each model's capacity, shared with the other replicas
        await llm.prepare()
        await mcp.refresh()
        if mcp.waiting:
            retrying.append(
                asyncio.create_task(every(mcp.retry_s, mcp.refresh, "listing MCP tools", log))
            )

    @app.on_shutdown
    async def _stop() -> None:
        for task in retrying:
            task.cancel()
        await handler.detach()

    return app


def main() -> None:
    settings = settings_or_exit(ReasonerSettings, "reasoner", ReasonerSettings.require_llm)
    setup_logging(settings, "reasoner")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
