"""A worker's /healthz and /readyz (shared.health) on a real nats-server, the service a real
process: both 200 while connected; /readyz 503 as soon as NATS is gone, /healthz 503 once the
connection has been down past the grace; both 200 again when NATS is back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tools.procs import free_port, start_nats, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
RECONNECT_GRACE_S = 3.0

pytestmark = pytest.mark.timeout(120)


def _wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, last: Callable[[], str]
) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen after {timeout_s}s; last answer: {last()}")


class Probe:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.last: dict[str, str] = {}

    def status(self, path: str) -> int:
        try:
            response = httpx.get(f"{self.base}{path}", timeout=5)
        except httpx.HTTPError as exc:
            self.last[path] = f"{type(exc).__name__}: {exc}"
            return 0
        self.last[path] = f"{response.status_code} {response.text}"
        return response.status_code


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    port = free_port()
    proc = start_nats(port, tmp_path / "store", tmp_path / "nats.log")
    (tmp_path / "nats.pid").write_text(str(proc.pid))
    yield port, tmp_path
    pid = int((tmp_path / "nats.pid").read_text())
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_probes_follow_the_nats_connection(nats_server: tuple[int, Path], redis_url: str) -> None:
    nats_port, root = nats_server
    metrics_port = free_port()
    env = {
        **os.environ,
        "DECKHANDS_NATS_URL": f"nats://127.0.0.1:{nats_port}",
        "DECKHANDS_REDIS_URL": redis_url,
        "DECKHANDS_METRICS_PORT": str(metrics_port),
        "DECKHANDS_HEALTH_RECONNECT_GRACE_S": str(RECONNECT_GRACE_S),
    }
    log = root / "security.log"
    service = subprocess.Popen(
        [sys.executable, "-m", "services.security"],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    probe = Probe(metrics_port)
    try:
        wait_for_port(metrics_port, timeout_s=30, proc=service)
        _wait_for(lambda: probe.status("/readyz") == 200, 30, "ready", lambda: str(probe.last))
        assert probe.status("/healthz") == 200
        assert "consumer security" in probe.last["/readyz"]
        metrics = httpx.get(f"{probe.base}/metrics", timeout=5)
        assert metrics.status_code == 200 and "deckhands_" in metrics.text

        os.killpg(int((root / "nats.pid").read_text()), signal.SIGKILL)
        took = _wait_for(
            lambda: probe.status("/readyz") == 503, 10, "not ready", lambda: str(probe.last)
        )
        assert took < 5
        assert "nats" in probe.last["/readyz"] and "reconnecting" in probe.last["/readyz"]
        # Within the grace a broker outage restarts nothing; past it the process is not live.
        _wait_for(
            lambda: probe.status("/healthz") == 503,
            RECONNECT_GRACE_S + 10,
            "not live",
            lambda: str(probe.last),
        )
        assert "disconnected" in probe.last["/healthz"]
        assert service.poll() is None, "the service must not exit while it reconnects"

        restarted = start_nats(nats_port, root / "store", root / "nats.log")
        (root / "nats.pid").write_text(str(restarted.pid))
        _wait_for(
            lambda: probe.status("/readyz") == 200, 30, "ready again", lambda: str(probe.last)
        )
        assert probe.status("/healthz") == 200
    finally:
        service.terminate()
        try:
            service.wait(15)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait(5)
        print(log.read_text()[-4000:])
