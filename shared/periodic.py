"""A background round for the life of a process: work, every so often, surviving its failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["every"]


async def every(
    seconds: float, work: Callable[[], Awaitable[Any]], what: str, log: logging.Logger
) -> None:
    """Run `work` every `seconds` until cancelled; a failed round (Redis or NATS away for a
    moment) is logged as a warning naming `what`, and the next round tries again."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("%s failed: %s", what, exc)
