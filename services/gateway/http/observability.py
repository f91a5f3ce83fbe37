"""Each HTTP request is one server span (the root of the task's trace unless the client sent
a traceparent) and counts in /metrics, labelled by route template, not raw path."""

from __future__ import annotations

import time
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import HTTP_LATENCY, HTTP_REQUESTS

__all__ = ["HttpObservabilityMiddleware"]


def _route_template(scope: Scope) -> str:
    route: Any = scope.get("route")
    return str(getattr(route, "path", None) or "unmatched")


class HttpObservabilityMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.tracer = trace.get_tracer("deckhands.gateway")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        status = 500
        started = time.perf_counter()
        with self.tracer.start_as_current_span(
            f"{method} {scope['path']}",
            context=propagate.extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:

            async def send_and_watch(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = int(message["status"])
                await send(message)

            try:
                await self.app(scope, receive, send_and_watch)
            finally:
                route = _route_template(scope)
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                HTTP_REQUESTS.labels(method, route, str(status)).inc()
                HTTP_LATENCY.labels(method, route).observe(time.perf_counter() - started)
