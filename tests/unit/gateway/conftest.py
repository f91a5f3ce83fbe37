"""Fixtures for the gateway's unit tests: real nats-server and redis-server, no HTTP.

The gateway's tests get a nats-server of their own: what they queue for the controller must
not reach another suite's controller.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest
from faststream.nats import NatsBroker
from gateway_unit_doubles import StorageStandIn
from nats.js.api import KeyValueConfig

from services.gateway.main import build_gateway_broker
from services.gateway.settings import GatewaySettings
from services.gateway.tenants.records import TenantRecords
from shared.events import new_id
from shared.settings import CommonSettings
from shared.streams import ensure_streams
from shared.subjects import HISTORY_SUBJECT
from tools.procs import free_port, start_nats


@pytest.fixture(scope="session")
def gateway_unit_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = Path(tmp_path_factory.mktemp("gateway-unit-nats"))
    port = free_port()
    proc = start_nats(port, root / "store", root / "nats.log")
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
async def unit_settings(gateway_unit_nats_url: str, redis_url: str) -> GatewaySettings:
    settings = GatewaySettings(
        nats_url=gateway_unit_nats_url,
        redis_url=redis_url,
        history_timeout_s=0.5,
        history_page_size=2,
        sse_heartbeat_s=0.5,
        sse_gap_retry_s=0.05,
    )
    await ensure_streams(settings)
    return settings


@pytest.fixture
async def broker(unit_settings: GatewaySettings) -> AsyncIterator[NatsBroker]:
    broker = build_gateway_broker(unit_settings)
    await broker.start()
    yield broker
    await broker.stop()


@pytest.fixture(scope="session")
async def storage_stand_in(gateway_unit_nats_url: str) -> AsyncIterator[StorageStandIn]:
    # Subscribed once for the session, as the real storage service is: a responder that comes
    # and goes between tests can be reported as "no responders" just after it subscribed.
    nc = await nats.connect(gateway_unit_nats_url)
    stand_in = StorageStandIn()
    await nc.subscribe(HISTORY_SUBJECT, cb=stand_in.handle)
    await nc.flush()
    yield stand_in
    await nc.close()


@pytest.fixture
async def kv_records(settings: CommonSettings) -> AsyncIterator[TenantRecords]:
    """TenantRecords on a key-value bucket of the test's own (the tests share one nats-server),
    removed after."""
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    bucket = f"test-kv-{new_id()[:12]}"
    await js.create_key_value(KeyValueConfig(bucket=bucket, history=1))
    try:
        yield TenantRecords(lambda: js, bucket=bucket)
    finally:
        await js.delete_key_value(bucket)
        await nc.close()
