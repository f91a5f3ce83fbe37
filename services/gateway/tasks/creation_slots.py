"""A bound on the task creations one gateway handles at once.

Creating a task is a few writes (its record, its State, its first message on JetStream), so a
burst is served in milliseconds each; the bound keeps a burst far above what the stores answer
from piling up in memory and in latency. A creation beyond it waits briefly for a place, then is
answered 503 with Retry-After (nothing created: the client sends it again), rather than holding
its connection for tens of seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from ..errors import Overloaded
from ..metrics import CREATIONS_IN_FLIGHT, CREATIONS_REFUSED

__all__ = ["CreationSlots"]

_RETRY_AFTER_S = 1


class CreationSlots:
    def __init__(self, most: int, wait_s: float) -> None:
        self.most = most
        self.wait_s = wait_s
        self._slots = asyncio.Semaphore(most)

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        try:
            await asyncio.wait_for(self._slots.acquire(), self.wait_s)
        except TimeoutError:
            CREATIONS_REFUSED.inc()
            raise Overloaded(self.most, _RETRY_AFTER_S) from None
        CREATIONS_IN_FLIGHT.inc()
        try:
            yield
        finally:
            CREATIONS_IN_FLIGHT.dec()
            self._slots.release()
