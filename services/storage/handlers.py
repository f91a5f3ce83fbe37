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

# Room in a reply for its envelope (task id, last seq, the JSON list) and its headers.
_REPLY_ENVELOPE_BYTES = 16 * 1024


class StorageHandlers:
    def __init__(self, log: EventLog, max_reply_bytes: int) -> None:
        self.log = log
        self.max_reply_bytes = max_reply_bytes

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
        budget = min(request.max_bytes, self.max_reply_bytes - _REPLY_ENVELOPE_BYTES)
        page = await self.log.read(request.task_id, request.after, request.limit, budget)
        return HistoryReply(task_id=request.task_id, events=page.events, last_seq=page.last_seq)
