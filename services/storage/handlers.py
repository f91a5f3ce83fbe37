"""Persist each logged event; answer history queries."""

from __future__ import annotations

from prometheus_client import Counter

from shared.commands import HistoryReply, HistoryRequest
from shared.delivery import PermanentError
from shared.events import Event

from .event_log import EventLog

__all__ = ["StorageHandlers"]

STORED = Counter("deckhands_storage_events_stored_total", "Events persisted", ["kind"])
DUPLICATES = Counter("deckhands_storage_duplicates_total", "Redelivered events already stored")


class StorageHandlers:
    def __init__(self, log: EventLog) -> None:
        self.log = log

    async def on_event(self, event: Event) -> None:
        if event.seq is None:
            raise PermanentError(f"event {event.id} has no seq: only the controller logs events")
        fresh = await self.log.append(
            event.task_id, event.seq, event.id, event.kind, event.model_dump_json()
        )
        if fresh:
            STORED.labels(event.kind).inc()
        else:
            DUPLICATES.inc()

    async def on_history(self, request: HistoryRequest) -> HistoryReply:
        events, last_seq = await self.log.read(request.task_id, request.after, request.limit)
        return HistoryReply(task_id=request.task_id, events=events, last_seq=last_seq)
