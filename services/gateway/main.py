"""Wiring of the gateway: the FastAPI app, its NATS broker, and `main()` running uvicorn."""

from __future__ import annotations

import asyncio
import gc
import inspect
import logging
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from faststream.nats import JStream, NatsBroker
from opentelemetry.sdk.trace import TracerProvider

from shared.broker import WORK, build_broker
from shared.commands import ForgetTaskRequest, HistoryRequest
from shared.events import AgentStateChangedObservation, ChangeAgentStateAction, Event, MessageAction
from shared.redis_client import connect_redis
from shared.settings import CommonSettings
from shared.shutdown import exit_unless_done_within
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import (
    DELETIONS_STREAM,
    FORGET_SUBJECT,
    HISTORY_SUBJECT,
    Service,
    deletion_subject,
    event_subject,
    notice_subject,
    work_subject,
)
from shared.telemetry import setup_logging, setup_tracing
from shared.workspace import WORKSPACE_SUBJECT, WorkspaceRequest

from .context import build_context, build_deliverer, build_workspace
from .errors import install_error_handlers
from .http.limits import BodyLimitMiddleware, bounded_h11_protocol
from .http.observability import HttpObservabilityMiddleware
from .http.trusted_hosts import TrustedHostMiddleware
from .http.warm_routes import warm_routes
from .routes import (
    admin,
    blobs,
    docs,
    events,
    health,
    keys,
    quotas,
    secrets,
    tasks,
    ui,
    webhooks,
    workspace,
)
from .secrets.records import SecretsRefill
from .settings import GatewaySettings
from .webhooks.delivery import WebhookDeliverer

__all__ = ["build_app", "build_gateway_broker", "declare_direct_receivers", "main"]

log = logging.getLogger("deckhands.gateway")


def build_gateway_broker(
    settings: CommonSettings, tracer_provider: TracerProvider | None = None
) -> NatsBroker:
    """The gateway's broker. Its publishers are declared for the AsyncAPI document only: the
    gateway publishes through shared.publishing, which adds the Nats-Msg-Id."""
    broker = build_broker(settings, Service.GATEWAY, tracer_provider)
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="gateway.user_input",
        description="A task's first message, user messages, and stop/pause/resume/confirmation "
        "requests (ChangeAgentStateAction), one subject per task.",
        schema=MessageAction | ChangeAgentStateAction,
    )
    broker.publisher(
        HISTORY_SUBJECT,
        title="gateway.history_query",
        description="Request/reply with the storage service, answered with a HistoryReply.",
        schema=HistoryRequest,
    )
    broker.publisher(
        deletion_subject("*"),
        stream=JStream(DELETIONS_STREAM, declare=False),
        title="gateway.task_deleted",
        description="A deleted task, for every storage replica to remove its copy of the log.",
        schema=ForgetTaskRequest,
    )
    broker.publisher(
        FORGET_SUBJECT,
        title="gateway.forget_query",
        description="Request/reply with the storage replicas that are up: remove a deleted "
        "task's events now (the deletion stream reaches the others when they are back).",
        schema=ForgetTaskRequest,
    )
    broker.publisher(
        WORKSPACE_SUBJECT,
        title="gateway.workspace_request",
        description="Request/reply with a runtime replica: a task's workspace in or out "
        "(archive, file, diff), answered with a WorkspaceReply.",
        schema=WorkspaceRequest,
    )
    return broker


def declare_direct_receivers(broker: NatsBroker) -> None:
    """What the gateway receives with nats-py directly rather than through a FastStream
    subscriber, declared on a broker that is never started (tools/gen_schemas.py) so that
    the AsyncAPI document names every receiver of every send."""
    broker.subscriber(
        notice_subject("*"),
        title="gateway.webhooks",
        description="The tasks' state changes, for webhook delivery: one durable pull consumer "
        "(`webhooks`) shared by the gateway replicas (webhooks/delivery.py).",
    )(_a_notice)
    broker.subscriber(
        event_subject("*"),
        title="gateway.live_events",
        description="A task's log as it grows, for a client following its Server-Sent Events "
        "stream: a core NATS subscription per stream (events/stream.py).",
    )(_a_live_event)


# Their message types, for the document; never called.
async def _a_notice(body: AgentStateChangedObservation) -> None:
    raise RuntimeError("declared for the AsyncAPI document only")


async def _a_live_event(body: Event) -> None:
    raise RuntimeError("declared for the AsyncAPI document only")


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: GatewaySettings = app.state.settings
    broker: NatsBroker = app.state.broker
    try:
        await ensure_streams(settings)
    except Exception as exc:
        raise RuntimeError(
            f"gateway start-up: cannot reach NATS JetStream at {settings.nats_url} "
            f"(DECKHANDS_NATS_URL): {type(exc).__name__}: {exc}"
        ) from exc
    redis = connect_redis(settings.redis_url, settings)
    try:
        await redis.ping()
    except Exception as exc:
        await redis.aclose()
        raise RuntimeError(
            f"gateway start-up: cannot reach Redis at {settings.redis_url} "
            f"(DECKHANDS_REDIS_URL): {type(exc).__name__}: {exc}"
        ) from exc
    deliverer: WebhookDeliverer | None = None
    refill: SecretsRefill | None = None
    try:
        await broker.start()
        app.state.gateway = build_context(settings, broker, redis)
        app.state.workspace = build_workspace(settings, broker, redis, app.state.gateway)
        deliverer = build_deliverer(settings, broker, redis, app.state.gateway)
        await deliverer.start()
        refill = app.state.gateway.secrets_refill
        if refill is not None:
            await refill.start()
        await warm_routes(app)
        # What start-up made (modules, routes, models) lives as long as the process: kept out
        # of the collector's reach, a burst's collections scan only what requests make.
        gc.collect()
        gc.freeze()
        log.info("gateway ready (NATS %s, Redis %s)", settings.nats_url, settings.redis_url)
        yield
    finally:
        app.state.gateway = None
        if deliverer is not None:
            await deliverer.stop()
        if refill is not None:
            await refill.stop()
        try:
            await _stop_broker(broker)
        finally:
            await redis.aclose()


async def _stop_broker(broker: NatsBroker) -> None:
    """Drain the connection; if NATS is gone (drain refuses while reconnecting), just close it,
    so that shutdown never hangs or fails on the way out."""
    try:
        await broker.stop()
    except Exception as exc:
        log.warning("NATS connection not drained (%s: %s); closing it", type(exc).__name__, exc)
        connection = getattr(broker, "_connection", None)
        if connection is not None and not connection.is_closed:
            try:
                await connection.close()
            except Exception as closing:  # what it still had to send cannot be sent
                log.warning("NATS connection closed uncleanly (%s)", type(closing).__name__)


# FastAPI 0.16x traces every request, its dependencies and its serialization itself whenever
# a tracer provider is installed (shared.telemetry always installs one), and keeps the body and
# the arguments it validated for its span processors. HttpObservabilityMiddleware is the
# gateway's one span per request: it records no request content (a secret's value is one),
# and the duplicate spans cost a fifth of a task creation's CPU. Older FastAPI has no such
# option, nor the telemetry it turns off.
_NO_FRAMEWORK_TELEMETRY: dict[str, Any] = (
    {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters
    else {}
)


def build_app(
    settings: GatewaySettings | None = None, tracer_provider: TracerProvider | None = None
) -> FastAPI:
    """Pure wiring: nothing connects until the app's lifespan starts."""
    settings = settings or GatewaySettings()
    app = FastAPI(
        title="deckhands gateway",
        version="1",
        summary="Run OpenHands-style coding agents: create tasks, follow their events, steer them.",
        lifespan=_lifespan,
        # The document is served by routes/docs.py, behind a key; no public page.
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        **_NO_FRAMEWORK_TELEMETRY,
    )
    app.state.settings = settings
    app.state.broker = build_gateway_broker(settings, tracer_provider)
    app.state.gateway = None
    install_error_handlers(app)
    # Inside the observability middleware, so that a refused body is counted and traced too.
    app.add_middleware(
        BodyLimitMiddleware,
        max_body_bytes=settings.max_request_body_bytes,
        max_upload_bytes=settings.workspace_max_upload_bytes,
    )
    app.add_middleware(TrustedHostMiddleware, trusted_hosts=settings.trusted_hosts)
    app.add_middleware(HttpObservabilityMiddleware)
    app.include_router(tasks.router)
    app.include_router(events.router)
    app.include_router(blobs.router)
    app.include_router(workspace.router)
    app.include_router(health.router)
    app.include_router(admin.router)
    app.include_router(quotas.router)
    app.include_router(secrets.router)
    app.include_router(webhooks.router)
    app.include_router(keys.router)
    app.include_router(docs.router)
    app.include_router(ui.router)  # the web console's static files, public
    return app


class _GatewayServer(uvicorn.Server):
    """uvicorn waits for open connections before it shuts the app down; event streams never
    end by themselves, so on the exit signal they are asked to end first. The whole shutdown
    is bounded, as every service's is (shared/shutdown.py): the app's own (its broker and
    stores closed) may wait for ever on a NATS or Redis gone meanwhile."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, shutdown_timeout_s: float) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown_timeout_s = shutdown_timeout_s
        self._deadline: threading.Timer | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._deadline is None:  # the process ends with its last line: never cancelled
            self._deadline = exit_unless_done_within(self._shutdown_timeout_s)
        context = getattr(self._app.state, "gateway", None)
        if context is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(context.events.stop_streams)
        super().handle_exit(sig, frame)


def main() -> None:
    settings = settings_or_exit(GatewaySettings, "gateway")
    setup_logging(settings, "gateway")
    provider = setup_tracing(settings, "gateway")
    app = build_app(settings, provider)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        log_config=None,  # keep setup_logging's handler, which redacts secrets
        timeout_graceful_shutdown=5,  # a connection that will not close cannot hold us forever
        # h11 rather than httptools: it bounds the header bytes it buffers, and its protocol
        # class is where an unfinished request gets its deadline (services.gateway.http.limits).
        http=bounded_h11_protocol(
            request_timeout_s=settings.request_timeout_s,
            max_header_bytes=settings.max_request_header_bytes,
            upload_timeout_s=settings.workspace_upload_timeout_s,
        ),
        h11_max_incomplete_event_size=settings.max_request_header_bytes,
        timeout_keep_alive=settings.keep_alive_timeout_s,
    )
    sockets = [shared_socket(settings)] if settings.reuse_port else None
    _GatewayServer(config, app, settings.shutdown_timeout_s).run(sockets=sockets)


def shared_socket(settings: GatewaySettings) -> socket.socket:
    """The listening socket, bound with SO_REUSEPORT: another gateway process may bind the same
    address and port (the same user only: Linux refuses it to anyone else)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        settings.host, settings.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.set_inheritable(True)
    return sock


if __name__ == "__main__":
    main()
