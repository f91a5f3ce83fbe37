"""Settings and wiring: build_app does no I/O, the broker is declared for AsyncAPI."""

from __future__ import annotations

import httpx
import pytest
from faststream.specification import AsyncAPI
from pydantic import ValidationError

from services.gateway.main import build_app, build_gateway_broker
from services.gateway.settings import GatewaySettings


def test_settings_come_from_deckhands_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PORT", "HOST", "DEFAULT_MAX_ITERATIONS", "SSE_HEARTBEAT_S"):
        monkeypatch.delenv(f"DECKHANDS_{name}", raising=False)
    defaults = GatewaySettings()
    assert (defaults.host, defaults.port) == ("127.0.0.1", 8000)
    assert defaults.default_max_iterations == 30 and defaults.sse_heartbeat_s == 15

    monkeypatch.setenv("DECKHANDS_PORT", "9123")
    monkeypatch.setenv("DECKHANDS_HOST", "0.0.0.0")
    monkeypatch.setenv("DECKHANDS_DEFAULT_MAX_ITERATIONS", "12")
    monkeypatch.setenv("DECKHANDS_HISTORY_TIMEOUT_S", "2.5")
    monkeypatch.setenv("DECKHANDS_IDEMPOTENCY_TTL_S", "60")
    settings = GatewaySettings()
    assert (settings.host, settings.port, settings.default_max_iterations) == ("0.0.0.0", 9123, 12)
    assert (settings.history_timeout_s, settings.idempotency_ttl_s) == (2.5, 60)


@pytest.mark.parametrize(
    ("variable", "value", "field"),
    [
        ("DECKHANDS_PORT", "70000", "port"),
        ("DECKHANDS_DEFAULT_MAX_ITERATIONS", "0", "default_max_iterations"),
        ("DECKHANDS_HISTORY_TIMEOUT_S", "-1", "history_timeout_s"),
        ("DECKHANDS_NATS_URL", "localhost", "nats_url"),
    ],
)
def test_bad_settings_fail_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as failure:
        GatewaySettings()
    assert field in str(failure.value)


async def test_build_app_connects_to_nothing() -> None:
    # Nothing listens on these ports; building (and serving docs) must not notice.
    settings = GatewaySettings(nats_url="nats://127.0.0.1:9", redis_url="redis://127.0.0.1:9/0")
    app = build_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        # No public page (the document needs a key: tests/integration/gateway).
        assert (await http.get("/docs")).status_code == 404
    schema = app.openapi()
    create = schema["paths"]["/v1/tasks"]["post"]
    assert "202" in create["responses"]
    assert any(p["name"] == "Idempotency-Key" for p in create["parameters"])
    stream = schema["paths"]["/v1/tasks/{task_id}/events/stream"]["get"]
    assert any(p["name"] == "Last-Event-ID" for p in stream["parameters"])


def test_broker_declares_what_the_gateway_publishes() -> None:
    document = AsyncAPI(build_gateway_broker(GatewaySettings())).to_specification().to_jsonable()
    addresses = {channel["address"] for channel in document["channels"].values()}
    assert {"deckhands.work.controller.*", "deckhands.storage.history"} <= addresses


_ONE_SPAN_A_REQUEST = """
import asyncio, json, httpx
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from services.gateway.main import build_app
from services.gateway.settings import GatewaySettings

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
app = build_app(GatewaySettings(nats_url="nats://127.0.0.1:9", redis_url="redis://127.0.0.1:9/0"))

async def main():
    # Without its lifespan the gateway answers 500 past the routing: a request all the same.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        await http.post("/v1/tasks", json={"task": "MARKER-4711", "max_iterations": "x"})
        await http.get("/healthz")
asyncio.run(main())
spans = exporter.get_finished_spans()
print(json.dumps({
    "spans": [[s.name, s.instrumentation_scope.name] for s in spans],
    "marker": any("MARKER-4711" in json.dumps(s.to_json()) for s in spans),
}))
"""


def test_each_request_is_one_span_of_the_gateway_holding_none_of_its_content() -> None:
    """With a tracer provider installed (as every service has), FastAPI 0.16x would also trace
    each request, its dependencies and its serialization, and keep what it validated for its
    span processors; the gateway's own span is the only one, and no body is in it. In a
    process of its own: the tracer provider is set once a process."""
    import json
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _ONE_SPAN_A_REQUEST],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["spans"] == [
        ["POST /v1/tasks", "deckhands.gateway"],
        ["GET /healthz", "deckhands.gateway"],
    ], seen
    assert not seen["marker"]
