"""shared.health: when a consumer counts as stalled, and that a wedged event loop fails the
probes (the answer comes from the loop, not from the HTTP thread)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from shared.health import HealthMonitor, serve_metrics_and_health
from tools.procs import free_port


@dataclass
class FakeInfo:
    num_pending: int


class FakeConnection:
    def __init__(self) -> None:
        self.is_closed = False
        self.is_connected = True
        self.pending = 0

    def jetstream(self) -> FakeConnection:
        return self

    async def consumer_info(self, stream: str, durable: str) -> FakeInfo:
        return FakeInfo(self.pending)


@dataclass
class FakeStream:
    name: str


@dataclass
class FakeConfig:
    durable_name: str


@dataclass
class FakeSubscriber:
    stream: FakeStream
    config: FakeConfig


class FakeBroker:
    def __init__(self) -> None:
        self.connection = FakeConnection()
        self.subscribers = [FakeSubscriber(FakeStream("DECKHANDS_WORK"), FakeConfig("security"))]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _monitor() -> tuple[HealthMonitor, FakeBroker, Clock]:
    clock = Clock()
    monitor = HealthMonitor(stall_s=60, reconnect_grace_s=30, deadline_s=1, clock=clock)
    broker = FakeBroker()
    monitor.watch(broker)
    return monitor, broker, clock


async def test_an_idle_consumer_is_ready_however_long_it_waits() -> None:
    monitor, _, clock = _monitor()
    clock.now += 10_000
    report = await monitor.readiness()
    assert report.ok, report.checks


async def test_messages_waiting_with_no_progress_for_the_stall_time_is_not_ready() -> None:
    monitor, broker, clock = _monitor()
    broker.connection.pending = 7
    clock.now += 59
    assert (await monitor.readiness()).ok
    clock.now += 2
    report = await monitor.readiness()
    assert not report.ok
    assert "stalled: 7 messages waiting" in report.checks["consumer security"]
    # A message received (or finished) is progress.
    monitor.received("security")
    assert (await monitor.readiness()).ok
    clock.now += 61
    monitor.finished("security")
    assert (await monitor.readiness()).ok


async def test_liveness_holds_through_a_short_outage_and_fails_past_the_grace() -> None:
    monitor, broker, clock = _monitor()
    assert (await monitor.liveness()).ok
    broker.connection.is_connected = False
    await monitor.disconnected()
    clock.now += 29
    live = await monitor.liveness()
    assert live.ok and live.checks["nats"].startswith("ok (disconnected")
    assert not (await monitor.readiness()).ok
    clock.now += 2
    assert not (await monitor.liveness()).ok
    broker.connection.is_connected = True
    await monitor.reconnected()
    assert (await monitor.liveness()).ok and (await monitor.readiness()).ok
    broker.connection.is_closed = True
    assert (await monitor.liveness()).checks["nats"] == "connection closed"


async def test_a_service_not_yet_connected_is_live_but_not_ready() -> None:
    monitor = HealthMonitor()
    assert (await monitor.liveness()).ok
    assert not (await monitor.readiness()).ok


@pytest.fixture
def loop_in_thread() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.mark.timeout(30)
def test_a_wedged_event_loop_fails_the_probes_within_the_deadline(
    loop_in_thread: asyncio.AbstractEventLoop,
) -> None:
    monitor, _, _ = _monitor()
    monitor.clock = time.monotonic
    monitor.deadline_s = 0.5
    port = free_port()
    server = serve_metrics_and_health(port, loop_in_thread, monitor)
    try:
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"{base}/readyz", timeout=5).status_code == 200

        def block(seconds: float) -> Any:
            time.sleep(seconds)

        loop_in_thread.call_soon_threadsafe(block, 3.0)  # a handler that blocks the loop
        time.sleep(0.1)
        started = time.monotonic()
        answer = httpx.get(f"{base}/healthz", timeout=5)
        assert answer.status_code == 503
        assert "did not answer" in answer.json()["checks"]["event_loop"]
        assert time.monotonic() - started < 1.5
        # /metrics does not need the loop.
        assert httpx.get(f"{base}/metrics", timeout=5).status_code == 200
    finally:
        server.shutdown()
        server.server_close()
