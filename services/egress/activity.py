"""Each task's connections, sent to its log (issue 27, item 4).

Every destination a sandbox asked for (reached, with its bytes and duration, or refused and
why) is recorded here as its connection ends, and about once a second each task's records go
to the controller as one EgressActivityObservation, which it logs. Relaying never waits for
this: a record that cannot be sent (NATS away) is dropped with a warning and counted, and a
task that opens connections faster than a log entry holds has the rest counted (`more`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from shared.events import (
    MAX_CONNECTIONS_PER_ENTRY,
    EgressActivityObservation,
    EgressConnection,
    EventSource,
)

from .metrics import ACTIVITY_DROPPED

__all__ = ["Activity", "Publish"]

log = logging.getLogger("deckhands.egress")

# Sends one task's entry to the controller; raises if it could not.
Publish = Callable[[EgressActivityObservation], Awaitable[None]]


class _Pending:
    def __init__(self) -> None:
        self.connections: list[EgressConnection] = []
        self.more = 0


class Activity:
    def __init__(self, publish: Publish | None, interval_s: float) -> None:
        self.publish = publish
        self.interval_s = interval_s
        self._pending: dict[str, _Pending] = {}

    def record(self, task_id: str, connection: EgressConnection) -> None:
        pending = self._pending.setdefault(task_id, _Pending())
        if len(pending.connections) < MAX_CONNECTIONS_PER_ENTRY:
            pending.connections.append(connection)
        else:
            pending.more += 1

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if self.publish is None or not pending:
            return
        entries = [
            EgressActivityObservation(
                task_id=task_id,
                source=EventSource.ENVIRONMENT,
                connections=p.connections,
                more=p.more,
            )
            for task_id, p in pending.items()
        ]
        results = await asyncio.gather(
            *(self.publish(entry) for entry in entries), return_exceptions=True
        )
        for entry, result in zip(entries, results, strict=True):
            if isinstance(result, BaseException):
                ACTIVITY_DROPPED.inc(len(entry.connections) + entry.more)
                log.warning("task %s: its connections were not logged: %s", entry.task_id, result)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.flush()


def now() -> datetime:
    return datetime.now(UTC)
