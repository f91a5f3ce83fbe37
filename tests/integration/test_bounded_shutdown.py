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


def test_a_stuck_shutdown_ends_the_service(settings: CommonSettings) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, settings.nats_url],
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
    assert code == EXIT_SHUTDOWN_STUCK, err[-2000:]
    assert took < 10
    assert "shutdown did not finish within 1s" in err
