"""Declare deckhands' JetStream streams and blob store: `python -m tools.streams [--wait 60]`.

Run once per deployment, before the services, with credentials that may create streams (the
admin user of a locked NATS; `make up` does it, and on Kubernetes the `nats-streams` Job).
The services only check that the streams are there. A JetStream cluster that has just started
answers "no leader" until its servers have elected one: this waits for it, up to `--wait`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from shared.settings import CommonSettings
from shared.streams import ensure_streams

__all__ = ["declare_streams", "main"]

log = logging.getLogger("deckhands.streams")


async def declare_streams(settings: CommonSettings, wait_s: float = 60.0) -> None:
    """ensure_streams, again every second while JetStream is not ready, until `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await ensure_streams(settings)
            return
        except Exception as exc:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"cannot declare the streams on {settings.nats_url} after {wait_s:.0f}s: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            log.info("JetStream not ready yet (%s: %s); retrying", type(exc).__name__, exc)
            await asyncio.sleep(1.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for JetStream")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    settings = CommonSettings()
    try:
        asyncio.run(declare_streams(settings, args.wait))
    except RuntimeError as exc:
        sys.exit(str(exc))
    print(f"streams declared on {settings.nats_url} ({settings.stream_replicas} replicas)")


if __name__ == "__main__":
    main()
