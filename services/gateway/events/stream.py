"""A task's live event stream (Server-Sent Events), without gaps or duplicates.

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
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from shared.commands import HistoryReply
from shared.events import TERMINAL_STATES
from shared.subjects import event_subject

from ..errors import GatewayError
from ..http.sse import sse_comment, sse_event, sse_retry
from ..metrics import OPEN_STREAMS
from .history import HistoryClient, event_seq

__all__ = ["EventSequencer", "EventStream", "is_terminal_event"]

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
