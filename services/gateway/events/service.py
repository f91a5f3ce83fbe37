"""A task's events behind the API: pages of its log, its trajectory, and its live streams
(events/stream.py), bounded per client and per tenant."""

from __future__ import annotations

import asyncio
import time

from faststream.nats import NatsBroker

from ..errors import QuotaExceeded, StorageBehind, TooManyStreams
from ..tasks.service import TaskService
from .history import HistoryClient, event_seq
from .models import EventPage, Trajectory
from .stream import EventStream

__all__ = ["EventService"]

_STREAM_RETRY_S = 5  # a stream of the tenant's may well have ended by then


def _count_down(counts: dict[str, int], holder: str) -> None:
    left = counts.get(holder, 1) - 1
    if left > 0:
        counts[holder] = left
    else:
        counts.pop(holder, None)


class EventService:
    def __init__(
        self,
        broker: NatsBroker,
        history: HistoryClient,
        tasks: TaskService,
        *,
        heartbeat_s: float,
        gap_retry_s: float,
        catch_up_s: float = 5.0,
        max_streams_per_client: int = 16,
    ) -> None:
        self.broker = broker
        self.history = history
        self.tasks = tasks
        self.heartbeat_s = heartbeat_s
        self.gap_retry_s = gap_retry_s
        self.catch_up_s = catch_up_s
        self._open: set[EventStream] = set()
        # Streams held open per client address: one client cannot take every connection.
        self.max_streams_per_client = max_streams_per_client
        self._held: dict[EventStream, tuple[str, str]] = {}  # its client and its tenant
        self._per_client: dict[str, int] = {}
        # And per tenant (its quota max_event_streams, on this gateway): one team's dashboards
        # cannot take every stream another team needs.
        self._per_tenant: dict[str, int] = {}

    async def page(self, task_id: str, tenant_id: str, after: int, limit: int) -> EventPage:
        """A page of the log. Storage consumes the log on its own, a moment behind the State:
        what the State says was logged is waited for (up to `catch_up_s`) while the page has
        room for it, so a client that saw the task end reads its whole log."""
        state = await self.tasks.get(task_id, tenant_id)
        reply = await self.history.page(task_id, after, limit)
        deadline = time.monotonic() + self.catch_up_s
        while (
            reply.last_seq < state.last_seq
            and len(reply.events) < limit
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(self.gap_retry_s)
            reply = await self.history.page(task_id, after, limit)
        next_after = (event_seq(reply.events[-1]) or after) if reply.events else after
        last_seq = max(reply.last_seq, state.last_seq)
        return EventPage(
            task_id=task_id,
            events=reply.events,
            next_after=next_after,
            last_seq=last_seq,
            has_more=next_after < last_seq,
        )

    async def trajectory(self, task_id: str, tenant_id: str) -> Trajectory:
        """Every event up to the State's last seq: storage consumes the log on its own, so
        right after a task ends it may still be storing the last events; wait for them. A log
        storage has not caught up with in `catch_up_s` (a stream's leader election can hold
        its consumer back longer) is a 503 naming how far it is, never a cut log that reads
        as whole."""
        state = await self.tasks.get(task_id, tenant_id)
        events = [event async for event in self.history.all_after(task_id)]
        deadline = time.monotonic() + self.catch_up_s
        while True:
            stored = (event_seq(events[-1]) or 0) if events else 0
            if stored >= state.last_seq:
                return Trajectory(task_id=task_id, task=state.task, events=events)
            if time.monotonic() >= deadline:
                raise StorageBehind(task_id, stored, state.last_seq)
            await asyncio.sleep(self.gap_retry_s)
            events += [event async for event in self.history.all_after(task_id, stored)]

    async def open_stream(
        self,
        task_id: str,
        after: int,
        *,
        tenant_id: str,
        client: str = "unknown",
        close_on_terminal: bool = False,
    ) -> EventStream:
        held = self._per_client.get(client, 0)
        if held >= self.max_streams_per_client:
            raise TooManyStreams(
                f"client {client} already has {held} event streams open, the most one client "
                f"may hold (DECKHANDS_MAX_EVENT_STREAMS_PER_CLIENT); close one, or resume later "
                "with Last-Event-ID"
            )
        await self.tasks.get(task_id, tenant_id)
        most = (await self.tasks.quotas.quotas(tenant_id)).max_event_streams
        tenant_held = self._per_tenant.get(tenant_id, 0)
        if tenant_held >= most:
            raise QuotaExceeded(
                "max_event_streams",
                most,
                tenant_held,
                _STREAM_RETRY_S,
                f"the tenant already has {tenant_held} event streams open on this gateway, the "
                "most it may; close one, or resume later with Last-Event-ID",
            )
        stream = EventStream(
            task_id,
            after,
            self.history,
            heartbeat_s=self.heartbeat_s,
            gap_retry_s=self.gap_retry_s,
            close_on_terminal=close_on_terminal,
            on_close=self._closed,
        )
        self._open.add(stream)
        self._held[stream] = (client, tenant_id)
        self._per_client[client] = held + 1
        self._per_tenant[tenant_id] = tenant_held + 1

        async def logged() -> int:
            return (await self.tasks.get(task_id, tenant_id)).last_seq

        await stream.start(self.broker.connection, logged)
        return stream

    def _closed(self, stream: EventStream) -> None:
        self._open.discard(stream)
        holder = self._held.pop(stream, None)
        if holder is not None:
            client, tenant_id = holder
            _count_down(self._per_client, client)
            _count_down(self._per_tenant, tenant_id)

    def stop_streams(self) -> None:
        """Ask every open stream to end (at shutdown), so no client holds the process up."""
        for stream in list(self._open):
            stream.stop()
