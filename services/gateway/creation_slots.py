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

from prometheus_client import Counter, Gauge

from .errors import Overloaded

__all__ = ["CreationSlots"]

CREATIONS_IN_FLIGHT = Gauge(
    "deckhands_gateway_creations_in_flight", "Task creations this gateway is handling now"
)
CREATIONS_REFUSED = Counter(
    "deckhands_gateway_creations_refused_total",
    "Task creations answered 503 because max_creations_in_flight were being handled",
)
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
