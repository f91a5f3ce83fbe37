"""The gateway as a real process (`python -m services.gateway`) on real nats-server and
redis-server, with the storage service played by `gateway_doubles.StorageDouble`.

The gateway starts with an admin key; the session's tenant (`tests`) and its API key are made
through the admin API, and the `http` client sends that key.

The gateway tests get a nats-server of their own: the tasks they create stay queued for a
controller that never comes, and must not be picked up by another suite's controller.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import nats
import pytest
from gateway_doubles import EGRESS_ALLOW, EGRESS_PRESETS, StorageDouble, gateway_env
from nats.aio.client import Client as NatsClient
from redis.asyncio import Redis

from services.gateway.settings import GatewaySettings
from shared.state_store import TaskStateStore
from shared.streams import ensure_streams
from shared.subjects import FORGET_SUBJECT, HISTORY_SUBJECT
from tools.api_access import auth_headers, issue_key, new_admin_key
from tools.procs import free_port, start_nats, wait_for_port

HEARTBEAT_S = 1.0
# No controller runs beside these tests: a task that must stop before its deletion never does.
DELETE_STOP_TIMEOUT_S = 1.0


@pytest.fixture(scope="session")
def gateway_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("gateway-nats")
    port = free_port()
    proc = start_nats(port, root / "store", root / "nats.log")
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
async def gateway_settings(gateway_nats_url: str, redis_url: str) -> GatewaySettings:
    settings = GatewaySettings(
        nats_url=gateway_nats_url,
        redis_url=redis_url,
        port=free_port(),
        history_timeout_s=1.0,
        sse_heartbeat_s=HEARTBEAT_S,
        sse_gap_retry_s=0.1,
        admin_api_key=new_admin_key(),
        delete_stop_timeout_s=DELETE_STOP_TIMEOUT_S,
        # Tests here check egress per task: the operator allowed it (it is off by default).
        allow_network_egress=True,
        egress_allow=EGRESS_ALLOW,
        egress_presets=EGRESS_PRESETS,
    )
    await ensure_streams(settings)
    return settings


@pytest.fixture(scope="session")
def admin_key(gateway_settings: GatewaySettings) -> str:
    assert gateway_settings.admin_api_key is not None
    return gateway_settings.admin_api_key.get_secret_value()


@pytest.fixture(scope="session")
def api_key(gateway_url: str, admin_key: str) -> str:
    """An API key of the tenant `tests`, which every test's `http` client acts as. No
    controller ends its tasks here, so none would ever free its place: the tenant may run any
    number of them, and replay trajectories (a fresh tenant has the server's defaults)."""
    key = issue_key(gateway_url, admin_key, "tests", name="gateway tests")
    limits = {"max_running_tasks": 100_000, "allow_trajectory_tasks": True}
    answer = httpx.put(
        f"{gateway_url}/v1/admin/tenants/tests/limits",
        json=limits,
        headers=auth_headers(admin_key),
        timeout=15,
    )
    answer.raise_for_status()
    return key


@pytest.fixture(scope="session")
def gateway_url(
    gateway_settings: GatewaySettings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    log = Path(tmp_path_factory.mktemp("gateway")) / "gateway.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.gateway"],
        env=gateway_env(gateway_settings),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for_port(gateway_settings.port, timeout_s=30, proc=proc)
    except Exception:
        proc.kill()
        print(log.read_text())
        raise
    yield f"http://{gateway_settings.host}:{gateway_settings.port}"
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    finally:
        print(log.read_text()[-5000:])


@pytest.fixture
async def http(gateway_url: str, api_key: str, redis: Redis) -> AsyncIterator[httpx.AsyncClient]:
    # What the controller does once every live task has its State: no controller runs here.
    await TaskStateStore(redis).mark_intact()
    async with httpx.AsyncClient(
        base_url=gateway_url, headers=auth_headers(api_key), timeout=15
    ) as client:
        yield client


@pytest.fixture
async def nc(gateway_nats_url: str) -> AsyncIterator[NatsClient]:
    client = await nats.connect(gateway_nats_url)
    yield client
    await client.close()


@pytest.fixture(scope="session")
async def _storage_double(gateway_nats_url: str) -> AsyncIterator[StorageDouble]:
    # One long-lived responder, as the real storage service is: a responder that comes and
    # goes with each test can be reported as "no responders" for a moment after it subscribed.
    client = await nats.connect(gateway_nats_url)
    double = StorageDouble()
    await client.subscribe(HISTORY_SUBJECT, cb=double.handle)
    await client.subscribe(FORGET_SUBJECT, cb=double.handle_forget)
    await client.flush()
    yield double
    await client.close()


@pytest.fixture
def storage(_storage_double: StorageDouble) -> StorageDouble:
    _storage_double.answering = True
    _storage_double.requests.clear()
    return _storage_double
