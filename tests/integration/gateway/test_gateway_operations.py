"""Health, readiness, metrics, docs, and start-up against real (and then stopped) servers."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from gateway_doubles import StorageDouble, gateway_env

from services.gateway.main import build_app
from services.gateway.settings import GatewaySettings
from services.gateway.tenants.api_keys import issue_api_key
from tools.api_access import auth_headers
from tools.procs import free_port, start_nats, start_redis, wait_for_port


async def test_health_ready_metrics_and_docs(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "checks": {"nats": "ok", "redis": "ok"}}

    await http.post("/v1/tasks", json={"task": "x"})
    metrics = await http.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    labels = 'method="POST",route="/v1/tasks",status="202"'
    assert f"deckhands_gateway_http_requests_total{{{labels}}}" in text
    assert "deckhands_gateway_tasks_created_total" in text

    assert (await http.get("/docs")).status_code == 404  # no page: it could not send the key
    assert (await http.get("/openapi.json", headers={"Authorization": ""})).status_code == 401
    paths = (await http.get("/openapi.json")).json()["paths"]
    assert {
        "/v1/tasks",
        "/v1/tasks/{task_id}",
        "/v1/tasks/{task_id}/events",
        "/v1/tasks/{task_id}/events/stream",
        "/v1/tasks/{task_id}/messages",
        "/v1/tasks/{task_id}/stop",
        "/v1/tasks/{task_id}/pause",
        "/v1/tasks/{task_id}/resume",
        "/v1/tasks/{task_id}/confirmation",
        "/v1/tasks/{task_id}/trajectory",
        "/v1/admin/tenants",
        "/v1/admin/tenants/{tenant_id}/keys",
        "/v1/admin/tenants/{tenant_id}/keys/{prefix}",
        "/healthz",
        "/readyz",
        "/metrics",
    } <= set(paths)


@pytest.fixture
async def own_servers(
    tmp_path: Path,
) -> AsyncIterator[tuple[GatewaySettings, subprocess.Popen[bytes], subprocess.Popen[bytes]]]:
    nats_port, redis_port = free_port(), free_port()
    nats_proc = start_nats(nats_port, tmp_path / "nats", tmp_path / "nats.log")
    redis_proc = start_redis(redis_port, tmp_path / "redis", tmp_path / "redis.log")
    settings = GatewaySettings(
        nats_url=f"nats://127.0.0.1:{nats_port}",
        redis_url=f"redis://127.0.0.1:{redis_port}/0",
        readiness_timeout_s=1.0,
    )
    yield settings, nats_proc, redis_proc
    for proc in (nats_proc, redis_proc):
        proc.terminate()
        proc.wait(10)


async def test_readyz_names_what_is_down(
    own_servers: tuple[GatewaySettings, subprocess.Popen[bytes], subprocess.Popen[bytes]],
) -> None:
    settings, nats_proc, redis_proc = own_servers
    app = build_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
            assert (await http.get("/readyz")).status_code == 200

            redis_proc.terminate()
            redis_proc.wait(10)
            resp = await http.get("/readyz")
            assert resp.status_code == 503
            body = resp.json()
            assert body["ready"] is False and body["checks"]["nats"] == "ok"
            assert body["checks"]["redis"].startswith("error")
            assert body["detail"] == "not ready: redis unavailable"
            # The process itself is still alive.
            assert (await http.get("/healthz")).status_code == 200
            # And a request that needs Redis says so instead of failing obscurely (checking
            # its key is the first thing that needs it).
            any_key = auth_headers(issue_api_key().key)
            resp = await http.post("/v1/tasks", json={"task": "x"}, headers=any_key)
            assert resp.status_code == 503 and "Redis" in resp.json()["detail"]

            nats_proc.terminate()
            nats_proc.wait(10)
            resp = await http.get("/readyz")
            assert resp.status_code == 503
            assert resp.json()["checks"]["nats"].startswith("error")
            assert resp.json()["detail"] == "not ready: nats, redis unavailable"


def test_start_up_fails_clearly_when_nats_is_unreachable(
    gateway_settings: GatewaySettings,
) -> None:
    settings = gateway_settings.model_copy(
        update={"nats_url": f"nats://127.0.0.1:{free_port()}", "port": free_port()}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "services.gateway"],
        env=gateway_env(settings),
        capture_output=True,
        timeout=60,
        check=False,
    )
    output = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode != 0
    assert "cannot reach NATS JetStream at " + settings.nats_url in output
    assert "DECKHANDS_NATS_URL" in output


def test_start_up_fails_clearly_on_a_bad_setting(gateway_settings: GatewaySettings) -> None:
    env = {**gateway_env(gateway_settings), "DECKHANDS_PORT": "not-a-port"}
    proc = subprocess.run(
        [sys.executable, "-m", "services.gateway"],
        env=env,
        capture_output=True,
        timeout=60,
        check=False,
    )
    # shared/startup.py: one line naming the variable, exit code 2, no traceback.
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("gateway: bad configuration: DECKHANDS_PORT: ")
    assert "Traceback" not in proc.stderr.decode()


@pytest.fixture
def second_gateway(
    gateway_settings: GatewaySettings, tmp_path: Path
) -> Iterator[tuple[GatewaySettings, subprocess.Popen[bytes], Path]]:
    """A gateway process of the test's own, to stop."""
    settings = gateway_settings.model_copy(update={"port": free_port()})
    log = tmp_path / "gateway.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gateway"],
        env=gateway_env(settings),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_port(settings.port, 30, proc)
    yield settings, proc, log
    if proc.poll() is None:
        proc.kill()
        proc.wait(5)


async def test_shutdown_ends_open_streams_and_exits(
    second_gateway: tuple[GatewaySettings, subprocess.Popen[bytes], Path],
    storage: StorageDouble,
    api_key: str,
) -> None:
    settings, proc, log = second_gateway
    base = f"http://{settings.host}:{settings.port}"
    async with httpx.AsyncClient(base_url=base, headers=auth_headers(api_key), timeout=20) as http:
        task_id = (await http.post("/v1/tasks", json={"task": "x"})).json()["id"]
        async with http.stream("GET", f"/v1/tasks/{task_id}/events/stream") as resp:
            assert resp.status_code == 200
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(httpx.HTTPError):
                async for _ in resp.aiter_lines():
                    pass
        code = await asyncio.to_thread(proc.wait, 15)
    # uvicorn re-raises the signal it handled once it has shut down cleanly.
    assert code in (0, -signal.SIGTERM), log.read_text()
    assert time.monotonic() - started < 3  # the open stream did not hold it up
    text = log.read_text()
    assert "Application shutdown complete" in text
    assert "graceful shutdown exceeded" not in text and "Traceback" not in text, text
