"""A task's history, asked from the storage service over NATS request/reply, incrementally.

The log is append-only, so what a replica has read of a task stays true: each step asks storage
only for the events after the last one this replica holds, in pages bounded in bytes. The cache is
an optimisation, never the truth: a replica that never saw the task (or evicted it) reads it whole
from storage, and a restart loses nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from faststream.nats import NatsBroker
from pydantic import ValidationError

from shared.commands import HistoryReply, HistoryRequest
from shared.events import EventAdapter
from shared.subjects import HISTORY_SUBJECT

from .errors import HistoryNotReady
from .metrics import HISTORY_CACHE_BYTES, HISTORY_EVENTS_GIVEN, HISTORY_EVENTS_READ

__all__ = ["HistoryCache"]

log = logging.getLogger("deckhands.reasoner.history")

# Storage stores an event a few milliseconds after the controller logs it: ask again soon, then
# less often.
_FIRST_POLL_S = 0.005
_MAX_POLL_S = 0.1


@dataclass
class _TaskHistory:
    events: list[Any] = field(default_factory=list)
    last_seq: int = 0  # every seq up to this one has been read (unknown kinds are left out)
    size: int = 0  # bytes of JSON read for it, what the cache's budget counts


class HistoryCache:
    """Per replica: the events already read for recent tasks, least recently used first out."""

    def __init__(
        self,
        broker: NatsBroker,
        *,
        max_bytes: int,
        page_size: int,
        page_bytes: int,
        request_timeout_s: float,
        wait_s: float,
    ) -> None:
        self.broker = broker
        self.max_bytes = max_bytes
        self.page_size = page_size
        self.page_bytes = page_bytes
        self.request_timeout_s = request_timeout_s
        self.wait_s = wait_s
        self._tasks: OrderedDict[str, _TaskHistory] = OrderedDict()
        self._size = 0
        # Forks' inherited entries, one object per parent entry however many forks hold it:
        # forks made together hold one copy of their parent's history here, not `count`.
        self._inherited: weakref.WeakValueDictionary[tuple[str, int], Any] = (
            weakref.WeakValueDictionary()
        )

    async def fetch(
        self, task_id: str, up_to_seq: int, given: Sequence[dict[str, Any]] = ()
    ) -> list[Any]:
        """The task's events with seq <= up_to_seq, in order.

        `given` are the entries the step request carried (those logged since the previous
        step): when they continue what is cached, or start the log, storage is not asked.
        Storage writes the log a little after the controller appends to it, so the newest events
        may be missing for a moment: ask again for up to `wait_s`, then give up with
        HistoryNotReady.
        """
        if given:
            self._take_given(task_id, given)
        known = self._tasks.get(task_id)
        if known is not None and known.last_seq >= up_to_seq:
            self._tasks.move_to_end(task_id)
            return [e for e in known.events if e.seq <= up_to_seq]
        start = known.last_seq if known is not None else 0
        fresh, have, size = await self._read_after(task_id, start, up_to_seq)
        known = self._tasks.get(task_id)  # another step of the task may have read meanwhile
        if known is None or known.last_seq < start:
            if start > 0:  # evicted while reading: the events before `start` are gone
                fresh, have, size = await self._read_after(task_id, 0, up_to_seq)
            known = _TaskHistory()
            self._remember(task_id, known)
        if have > known.last_seq:
            known.events.extend(e for e in fresh if e.seq > known.last_seq)
            known.last_seq = have
            known.size += size
            self._size += size
        self._tasks.move_to_end(task_id)
        self._evict()
        return [e for e in known.events if e.seq <= up_to_seq]

    def _take_given(self, task_id: str, given: Sequence[dict[str, Any]]) -> None:
        known = self._tasks.get(task_id)
        last = known.last_seq if known is not None else 0
        raw: list[dict[str, Any]] = []
        for item in given:
            seq = item.get("seq")
            if not isinstance(seq, int) or seq <= last:
                continue  # already cached
            if seq != last + 1:
                break  # not a continuation: storage fills the gap
            raw.append(item)
            last = seq
        if not raw:
            return
        if known is None:
            known = _TaskHistory()
            self._remember(task_id, known)
        size = sum(len(json.dumps(item)) for item in raw)
        known.events.extend(self._shared(_parse(task_id, raw)))
        known.last_seq = last
        known.size += size
        self._size += size
        HISTORY_EVENTS_GIVEN.inc(len(raw))

    def _remember(self, task_id: str, entry: _TaskHistory) -> None:
        old = self._tasks.pop(task_id, None)
        if old is not None:
            self._size -= old.size
        self._tasks[task_id] = entry

    def _evict(self) -> None:
        # The task just read stays even when it alone passes the budget: its next step needs it.
        while self._size > self.max_bytes and len(self._tasks) > 1:
            _, oldest = self._tasks.popitem(last=False)
            self._size -= oldest.size
        HISTORY_CACHE_BYTES.set(self._size)

    async def _read_after(
        self, task_id: str, after: int, up_to_seq: int
    ) -> tuple[list[Any], int, int]:
        """Events after `after` up to at least `up_to_seq`: (events, last seq read, bytes)."""
        deadline = time.monotonic() + self.wait_s
        poll_s = _FIRST_POLL_S
        raw: list[dict[str, Any]] = []
        have, size = after, 0
        while True:
            reply, body_size = await self._ask(task_id, have)
            progressed = False
            for item in reply.events:
                seq = item.get("seq")
                if seq != have + 1:
                    break  # storage sends a gap-free run; anything else is ignored
                raw.append(item)
                have, progressed = seq, True
            size += body_size
            if progressed and have < reply.last_seq:
                continue  # another page
            if have >= up_to_seq:
                break
            if time.monotonic() >= deadline:
                raise HistoryNotReady(
                    f"storage has task {task_id} up to seq {have}, the step needs seq {up_to_seq}"
                )
            await asyncio.sleep(poll_s)
            poll_s = min(poll_s * 2, _MAX_POLL_S)
        HISTORY_EVENTS_READ.inc(len(raw))
        return self._shared(_parse(task_id, raw)), have, size

    def _shared(self, events: list[Any]) -> list[Any]:
        """`events` with each inherited entry replaced by the one another fork of the same
        parent holds, if any. Those carry that fork's ids, consistently among themselves
        (a fork's point is never inside a turn: its own entries answer none of them), and
        the prompt reads what they say, not whose they are."""
        shared = []
        for event in events:
            parent = getattr(event, "inherited_from", None)
            if parent is None or event.seq is None:
                shared.append(event)
                continue
            held = self._inherited.setdefault((parent, event.seq), event)
            shared.append(held if held.kind == event.kind else event)
        return shared

    async def _ask(self, task_id: str, after: int) -> tuple[HistoryReply, int]:
        request = HistoryRequest(
            task_id=task_id, after=after, limit=self.page_size, max_bytes=self.page_bytes
        )
        response = await self.broker.request(
            request, HISTORY_SUBJECT, timeout=self.request_timeout_s
        )
        try:
            reply = HistoryReply.model_validate_json(response.body)
        except ValidationError as exc:
            # Not the caller's fault: storage answered something else (an error, a newer schema).
            raise HistoryNotReady(f"storage sent an unusable history reply: {exc}") from exc
        if reply.error is not None:
            raise HistoryNotReady(f"storage could not serve the history: {reply.error}")
        return reply, len(response.body)


def _parse(task_id: str, raw: list[dict[str, Any]]) -> list[Any]:
    events = []
    for item in raw:
        try:
            events.append(EventAdapter.validate_python(item))
        except ValidationError as exc:
            # A kind this reasoner does not know (a newer service wrote it): leave it out of
            # the prompt rather than fail the whole step.
            log.warning(
                "task %s: skipping event seq %s (%s): %s",
                task_id,
                item.get("seq"),
                item.get("kind"),
                exc.errors()[0]["msg"],
            )
    return events
