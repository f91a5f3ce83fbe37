"""A task's events: pages of its history, and a live stream without gaps or duplicates.

The live stream joins two sources. The controller publishes every logged event on the task's
event subject; the storage service answers for everything already logged. The stream
subscribes to the subject *first*, then reads history, so nothing published in between is
missed; events are emitted strictly in seq order, each once. When a live event arrives ahead
of the next expected seq (a reconnect, a slow consumer, storage still catching up), the
missing range is fetched from storage, and retried until storage has it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import nats.errors
from faststream.nats import NatsBroker
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.commands import HistoryReply
from shared.events import TERMINAL_STATES
from shared.subjects import event_subject

from .errors import GatewayError, QuotaExceeded, TooManyStreams
from .history import HistoryClient, event_seq
from .metrics import OPEN_STREAMS
from .models import EventPage, Trajectory
from .sse import sse_comment, sse_event, sse_retry
from .task_service import TaskService

__all__ = ["EventSequencer", "EventService", "EventStream", "is_terminal_event"]

log = logging.getLogger("deckhands.gateway.events")

_RECONNECT_HINT_MS = 2000
_INBOX_SIZE = 10_000


def is_terminal_event(event: dict[str, Any]) -> bool:
    return event.get("kind") == "agent_state_changed" and event.get("agent_state") in {
        s.value for s in TERMINAL_STATES
    }


class EventSequencer:
    """Orders events by seq from any number of sources: each seq once, none skipped."""

    def __init__(self, after: int) -> None:
        self.last = after
        self._pending: dict[int, dict[str, Any]] = {}

    def offer(self, event: dict[str, Any]) -> None:
        seq = event_seq(event)
        if seq is not None and seq > self.last:
            self._pending.setdefault(seq, event)

    def ready(self) -> list[dict[str, Any]]:
        """The events that continue the sequence, in order; later ones wait for the gap."""
        out = []
        while (event := self._pending.pop(self.last + 1, None)) is not None:
            out.append(event)
            self.last += 1
        return out

    def has_next(self) -> bool:
        return self.last + 1 in self._pending

    @property
    def highest_known(self) -> int:
        return max(self._pending, default=self.last)


class EventStream:
    """One client's stream; `frames()` yields SSE text until the client goes, the task ends
    (if asked), or the gateway shuts down."""

    def __init__(
        self,
        task_id: str,
        after: int,
        history: HistoryClient,
        *,
        heartbeat_s: float,
        gap_retry_s: float,
        close_on_terminal: bool,
        on_close: Callable[[EventStream], None] = lambda _: None,
    ) -> None:
        self.task_id = task_id
        self._history = history
        self._seq = EventSequencer(after)
        self._target = after  # storage holds at least this much of the log
        self._heartbeat_s = heartbeat_s
        self._gap_retry_s = gap_retry_s
        self._close_on_terminal = close_on_terminal
        self._on_close = on_close
        # Live events; None asks the stream to end. Bounded: a client too slow to keep up
        # loses live events here and gets them from storage as a gap instead.
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=_INBOX_SIZE)
        self._sub: Subscription | None = None
        self._closed = False
        self._fill_failing = False

    async def start(
        self, connection: NatsClient, logged: Callable[[], Awaitable[int]] | None = None
    ) -> None:
        """Subscribe first, then read history, so nothing published in between is missed; a
        storage outage fails here, as an HTTP error, not inside a started stream.

        `logged` tells how far the log goes (the State's last seq), read once subscribed: an
        event published before the subscription that storage has not stored yet (it consumes
        the log a moment behind) is then known to be missing and fetched when it is stored,
        rather than waited for live, where it will never come again."""
        self._sub = await connection.subscribe(event_subject(self.task_id), cb=self._on_live)
        try:
            await connection.flush()  # the server knows the subscription before history is read
            if logged is not None:
                self._target = max(self._target, await logged())
            first = await self._history.page(self.task_id, self._seq.last)
        except BaseException:
            await self.close()
            raise
        self._absorb(first)

    def stop(self) -> None:
        """End the stream soon (gateway shutdown); the client reconnects with Last-Event-ID."""
        try:
            self._inbox.put_nowait(None)
        except asyncio.QueueFull:
            self._inbox.get_nowait()
            self._inbox.put_nowait(None)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._on_close(self)
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except nats.errors.Error:
                pass  # connection already closed: the subscription died with it

    async def _on_live(self, msg: Msg) -> None:
        try:
            self._inbox.put_nowait(msg.data)
        except asyncio.QueueFull:
            pass  # dropped: the gap it leaves is filled from storage

    def _absorb(self, reply: HistoryReply) -> None:
        self._target = max(self._target, reply.last_seq)
        for event in reply.events:
            self._seq.offer(event)

    def _behind(self) -> bool:
        return self._seq.last < max(self._target, self._seq.highest_known)

    async def _fill(self) -> bool:
        """Ask storage for what is missing; True if the next expected event is now at hand."""
        try:
            reply = await self._history.page(self.task_id, self._seq.last)
        except GatewayError as exc:
            # Retried every gap_retry_s: say it once per outage, not twice a second.
            level = logging.DEBUG if self._fill_failing else logging.WARNING
            log.log(
                level,
                "task %s: events after %d not yet available: %s",
                self.task_id,
                self._seq.last,
                exc,
            )
            self._fill_failing = True
            return False
        if self._fill_failing:
            log.info("task %s: storage answers again", self.task_id)
            self._fill_failing = False
        self._absorb(reply)
        return self._seq.has_next()

    async def frames(self) -> AsyncIterator[str]:
        OPEN_STREAMS.inc()
        try:
            yield sse_retry(_RECONNECT_HINT_MS)
            last_write = time.monotonic()
            next_fill = 0.0
            while True:
                for event in self._seq.ready():
                    yield sse_event(event_seq(event) or 0, str(event.get("kind", "event")), event)
                    last_write = time.monotonic()
                    if self._close_on_terminal and is_terminal_event(event):
                        return
                if self._behind() and time.monotonic() >= next_fill:
                    if await self._fill():
                        continue  # a long backlog is paged through without waiting
                    next_fill = time.monotonic() + self._gap_retry_s
                now = time.monotonic()
                wait = self._heartbeat_s - (now - last_write)
                if self._behind():
                    wait = min(wait, next_fill - now)
                if wait <= 0:
                    if now - last_write >= self._heartbeat_s:
                        yield sse_comment("keep-alive")
                        last_write = time.monotonic()
                    continue
                try:
                    data = await asyncio.wait_for(self._inbox.get(), wait)
                except TimeoutError:
                    continue
                if data is None:
                    return  # stopped: the gateway is shutting down
                self._offer_live(data)
        finally:
            # Cancelled when the client goes away; the clean-up must still run to the end.
            with anyio.CancelScope(shield=True):
                await self.close()
            OPEN_STREAMS.dec()

    def _offer_live(self, data: bytes) -> None:
        try:
            event = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            log.warning("task %s: unparseable event on the event subject, skipped", self.task_id)
            return
        if isinstance(event, dict) and event.get("task_id") == self.task_id:
            self._seq.offer(event)


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
        right after a task ends it may still be storing the last events; wait for them."""
        state = await self.tasks.get(task_id, tenant_id)
        events = [event async for event in self.history.all_after(task_id)]
        deadline = time.monotonic() + self.catch_up_s
        while time.monotonic() < deadline:
            stored = (event_seq(events[-1]) or 0) if events else 0
            if stored >= state.last_seq:
                break
            await asyncio.sleep(self.gap_retry_s)
            events += [event async for event in self.history.all_after(task_id, stored)]
        return Trajectory(task_id=task_id, task=state.task, events=events)

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
