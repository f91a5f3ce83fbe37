"""The one way services build their NATS broker: telemetry, metrics and delivery policy wired in."""

from __future__ import annotations

from typing import Any

from faststream import AckPolicy
from faststream.nats import ConsumerConfig, JStream, NatsBroker, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus import NatsPrometheusMiddleware
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from .delivery import DeliveryGuard
from .settings import CommonSettings
from .subjects import EVENTS_STREAM, WORK_STREAM, Service

__all__ = ["EVENTS", "WORK", "build_broker", "durable_subscription"]

# Streams are declared by `ensure_streams`; subscribers only name them.
EVENTS = JStream(EVENTS_STREAM, declare=False)
WORK = JStream(WORK_STREAM, declare=False)


def build_broker(
    settings: CommonSettings, service: Service, tracer_provider: TracerProvider | None = None
) -> NatsBroker:
    guard = DeliveryGuard(
        service,
        max_deliveries=settings.max_deliveries,
        backoff_s=settings.retry_backoff_s,
        backoff_max_s=settings.retry_backoff_max_s,
    )
    return NatsBroker(
        settings.nats_url,
        name=f"deckhands-{service.value}",
        middlewares=[
            guard,
            NatsTelemetryMiddleware(tracer_provider=tracer_provider),
            NatsPrometheusMiddleware(registry=REGISTRY, app_name=f"deckhands-{service.value}"),
        ],
        max_reconnect_attempts=-1,
    )


def durable_subscription(
    settings: CommonSettings, stream: JStream, durable: str, *, workers: int = 1
) -> dict[str, Any]:
    """Keyword arguments for `broker.subscriber`: a pull consumer shared by every replica."""
    return {
        "stream": stream,
        "durable": durable,
        "pull_sub": PullSub(batch_size=max(1, workers), timeout=1.0),
        "max_workers": workers,
        "ack_policy": AckPolicy.MANUAL,
        # The guard bounds deliveries itself; the server must never drop a message silently.
        "config": ConsumerConfig(
            durable_name=durable, ack_wait=settings.ack_wait_s, max_deliver=-1
        ),
    }
