"""A service whose NATS connection closes for good exits (status 70) instead of living on cut
off from its broker, on a real nats-server: a message whose headers take it past max_payload
makes the server close the connection, and nats-py does not reconnect after that."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from shared.broker import EXIT_BROKER_LOST
from shared.settings import CommonSettings

ROOT = Path(__file__).resolve().parents[2]

SERVICE = """
import asyncio, sys
from shared.broker import build_broker
from shared.settings import CommonSettings
from shared.subjects import Service

async def main():
    broker = build_broker(CommonSettings(nats_url=sys.argv[1]), Service.SECURITY)
    await broker.start()
    nc = broker.connection
    # nats-py checks the payload's size, not the headers': the server refuses the message and
    # closes the connection.
    big = b"x" * (nc.max_payload - 10)
    await nc.publish("deckhands.test.big", big, headers={"Pad": "y" * 4000})
    await asyncio.sleep(20)
    print("still running without a broker")

asyncio.run(main())
"""


def test_a_connection_closed_for_good_ends_the_service(settings: CommonSettings) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SERVICE, settings.nats_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EXIT_BROKER_LOST, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "still running" not in done.stdout
    assert "closed for good" in done.stderr
