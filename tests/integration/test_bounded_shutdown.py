"""A service whose shutdown gets stuck exits by itself once DECKHANDS_SHUTDOWN_TIMEOUT_S has
passed (status 75), on a real nats-server: a runtime whose NATS and Redis were killed with it
had gone on for 40 minutes, its pool starting sandboxes the whole time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from shared.settings import CommonSettings
from shared.shutdown import EXIT_SHUTDOWN_STUCK

ROOT = Path(__file__).resolve().parents[2]

SERVICE = """
import asyncio, logging, sys
from faststream import FastStream
from shared.broker import build_broker
from shared.settings import CommonSettings
from shared.shutdown import bound_shutdown
from shared.subjects import Service

logging.basicConfig(level=logging.INFO)
broker = build_broker(CommonSettings(nats_url=sys.argv[1]), Service.SECURITY)
app = FastStream(broker)
bound_shutdown(app, 1.0)

@app.after_startup
async def started() -> None:
    print("started", flush=True)

@app.after_shutdown
async def stuck() -> None:
    await asyncio.sleep(3600)  # a store that never answers again

asyncio.run(app.run())
print("stopped cleanly")
"""


def _terminated_when_started(*argv: str) -> tuple[int, float, str]:
    """Run a program until it prints "started", send it SIGTERM: its exit status, how long it
    took to exit, and what it wrote on stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "started"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
        took = time.monotonic() - began
        _, err = proc.communicate(timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    return code, took, err


def test_a_stuck_shutdown_ends_the_service(settings: CommonSettings) -> None:
    code, took, err = _terminated_when_started(SERVICE, settings.nats_url)
    assert code == EXIT_SHUTDOWN_STUCK, err[-2000:]
    assert took < 10
    assert "shutdown did not finish within 1s" in err


def test_a_finished_shutdown_ends_nothing_later(settings: CommonSettings) -> None:
    """An app stopped inside a process that goes on (a test's, an embedding one) leaves no
    timer that would end that process."""
    program = (
        SERVICE.replace("bound_shutdown(app, 1.0)", "bound_shutdown(app, 0.5)")
        .replace("await asyncio.sleep(3600)  # a store that never answers again", "pass")
        .replace("asyncio.run(app.run())", "asyncio.run(started_and_stopped())")
    )
    program = program.replace(
        "asyncio.run(started_and_stopped())",
        "async def started_and_stopped():\n    await app.start()\n    await app.stop()\n\n"
        "asyncio.run(started_and_stopped())",
    )
    program += "import time; time.sleep(2); print('alive', flush=True)\n"
    done = subprocess.run(
        [sys.executable, "-c", program, settings.nats_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alive" in done.stdout


GATEWAY = """
import asyncio, contextlib, logging, sys
import uvicorn
from fastapi import FastAPI
from services.gateway.main import _GatewayServer

logging.basicConfig(level=logging.INFO)

@contextlib.asynccontextmanager
async def lifespan(app):
    print("started", flush=True)
    yield
    await asyncio.sleep(3600)  # closing a broker whose server never answers again

app = FastAPI(lifespan=lifespan)
config = uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None)
_GatewayServer(config, app, shutdown_timeout_s=1.0).run()
print("stopped cleanly")
"""


def test_a_stuck_shutdown_ends_the_gateway() -> None:
    """The gateway (uvicorn) bounds its shutdown the same way: its app's own, after the
    connections, may wait on a NATS or Redis gone meanwhile."""
    code, took, err = _terminated_when_started(GATEWAY)
    assert code == EXIT_SHUTDOWN_STUCK, err[-2000:]
    assert took < 10
    assert "shutdown did not finish within 1s" in err
