"""Waiting for something with a deadline, without losing a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

__all__ = ["wait_up_to"]


async def wait_up_to(seconds: float, awaitable: Awaitable[object]) -> bool:
    """Await `awaitable` for at most `seconds`: True if it finished, False on the deadline.

    A cancellation that an awaited call swallowed stays pending on the task; under it,
    asyncio.timeout reports its own expiry as TimeoutError, and a loop that suppresses
    timeouts then runs for ever (the runtime's pool upkeep hung a test session's shutdown so).
    Here a deadline reached while a cancellation is pending raises it.
    """
    try:
        async with asyncio.timeout(seconds):
            await awaitable
        return True
    except TimeoutError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError from None
        return False
