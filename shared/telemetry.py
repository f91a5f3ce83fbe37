"""Logging, OpenTelemetry tracing and the Prometheus /metrics endpoint, set up once per process."""

from __future__ import annotations

import asyncio
import logging
import re

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from .health import PROCESS_HEALTH, serve_metrics_and_health
from .settings import CommonSettings

__all__ = ["RedactingFilter", "setup_logging", "setup_metrics", "setup_tracing"]

_SECRET = re.compile(
    r"(?i)(api[_-]?key|token|secret|password|authorization)(['\"]?\s*[:=]\s*['\"]?)([^\s'\",]+)"
)
_BEARER = re.compile(r"(?i)\b(sk-[A-Za-z0-9_\-]{8,}|Bearer\s+[A-Za-z0-9._\-]+)")


class RedactingFilter(logging.Filter):
    """Keeps API keys and tokens out of logs, whatever a library chose to print."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = _BEARER.sub("[REDACTED]", _SECRET.sub(r"\1\2[REDACTED]", message))
        if redacted != message:
            record.msg, record.args = redacted, None
        return True


def setup_logging(settings: CommonSettings, service: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s")
    )
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
    for noisy in ("LiteLLM", "httpx", "docker", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _exporter(settings: CommonSettings) -> SpanExporter | None:
    if settings.otel_exporter == "console":
        return ConsoleSpanExporter()
    if settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter: SpanExporter = OTLPSpanExporter(endpoint=settings.otel_endpoint)
        return exporter
    return None


def setup_tracing(settings: CommonSettings, service: str) -> TracerProvider:
    """A provider is always installed so trace context propagates even when nothing exports.

    With no exporter nothing is recorded (spans are not sampled), and the services' consumers
    carry no trace from message to message (shared.broker leaves the tracing middleware out):
    the gateway still passes a caller's trace context on with the task. With an exporter every
    hop is a span of the one trace that started at the HTTP request.
    """
    exporter = _exporter(settings)
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"deckhands-{service}"}),
        sampler=None if exporter is not None else ALWAYS_OFF,
    )
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


def setup_metrics(settings: CommonSettings) -> None:
    """/metrics, /healthz and /readyz on DECKHANDS_METRICS_PORT (see shared.health). Called from
    a service's start-up hook, on its event loop: the health answers are computed there."""
    if not settings.metrics_port:
        return
    PROCESS_HEALTH.configure(
        stall_s=settings.health_stall_s,
        reconnect_grace_s=settings.health_reconnect_grace_s,
        deadline_s=settings.health_deadline_s,
    )
    serve_metrics_and_health(settings.metrics_port, asyncio.get_running_loop())
