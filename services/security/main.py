"""Wiring of the security monitor: settings, broker, subscriber, telemetry."""

from __future__ import annotations

from faststream import FastStream

from shared.broker import WORK, build_broker, durable_subscription
from shared.event_loop import run
from shared.events import ReviewedAction
from shared.shutdown import bound_shutdown
from shared.startup import settings_or_exit
from shared.streams import ensure_streams
from shared.subjects import Service, work_subject
from shared.telemetry import setup_logging, setup_metrics, setup_tracing

from .handlers import SecurityHandlers
from .settings import SecuritySettings

__all__ = ["build_app", "main"]


def build_app(settings: SecuritySettings | None = None) -> FastStream:
    settings = settings or SecuritySettings()
    broker = build_broker(settings, Service.SECURITY, setup_tracing(settings, "security"))
    handlers = SecurityHandlers(broker, settings.workspace_root)
    broker.subscriber(
        work_subject(Service.SECURITY),
        title="security.review",
        description="Rules on a runnable action, sent by the reasoner as the answer to a step "
        "(or by the controller, asking again); answers the controller with a ReviewedAction.",
        **durable_subscription(settings, WORK, "security", workers=settings.workers),
    )(handlers.on_review)
    # Declared for the AsyncAPI document only: the handler publishes through shared.publishing.
    broker.publisher(
        work_subject(Service.CONTROLLER, "*"),
        stream=WORK,
        title="security.reviewed_actions",
        description="The action under review and the SecurityVerdictObservation on it, in one "
        "message: the controller logs both and, when allowed, orders the run.",
        schema=ReviewedAction,
    )

    app = FastStream(broker)
    bound_shutdown(app, settings.shutdown_timeout_s)

    @app.on_startup
    async def _start() -> None:
        setup_metrics(settings)
        await ensure_streams(settings)

    return app


def main() -> None:
    settings = settings_or_exit(SecuritySettings, "security")
    setup_logging(settings, "security")
    run(build_app(settings).run())


if __name__ == "__main__":
    main()
