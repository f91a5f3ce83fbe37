"""Reading tasks' logs straight from JetStream, to rebuild States Redis lost.

Straight from the stream, not from the storage service: storage follows the stream a little
behind, and a State rebuilt from a log missing its last entries would log their seqs again.
A message of the stream is fetched by its subject (`next_by_subj`), one request per entry:
rebuilding is rare, and this needs only the stream's MSG.GET permission, no consumer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from shared.events import TERMINAL_STATES, AgentStateChangedObservation, EventAdapter, EventBase
from shared.subjects import EVENTS_STREAM, event_subject

from .errors import RebuildError

__all__ = ["TaskLog", "has_ended"]

_PREFIX = event_subject("*").removesuffix("*")  # "deckhands.events."


class TaskLog:
    def __init__(self, jetstream: Callable[[], JetStreamContext]) -> None:
        self._jetstream = jetstream
        # Reads in flight or just done, shared by the forks of one task made together.
        self._shared: dict[str, tuple[float, asyncio.Future[list[EventBase]]]] = {}

    async def read_shared(self, task_id: str, fresh_s: float = 2.0) -> list[EventBase]:
        """The task's log as `read` gives it, read once for every caller within `fresh_s`
        (ten forks of a task at once read its log once)."""
        now = time.monotonic()
        for key, (when, _) in list(self._shared.items()):
            if now - when > fresh_s:
                del self._shared[key]
        kept = self._shared.get(task_id)
        if kept is None:
            kept = (now, asyncio.ensure_future(self.read(task_id)))
            self._shared[task_id] = kept
        try:
            return await asyncio.shield(kept[1])
        except Exception:
            self._shared.pop(task_id, None)  # the next caller reads again
            raise

    async def read(self, task_id: str) -> list[EventBase]:
        """Every entry of the task's log, in stream order (empty if it has none)."""
        js = self._jetstream()
        subject = event_subject(task_id)
        entries: list[EventBase] = []
        seq = 1
        while True:
            try:
                msg = await js.get_msg(EVENTS_STREAM, seq=seq, subject=subject, next=True)
            except NotFoundError:
                return entries
            if msg.data:
                entries.append(_parsed(task_id, msg.data))
            if msg.seq is None:
                raise RebuildError(f"task {task_id}: the stream gave an entry without a seq")
            seq = msg.seq + 1

    async def task_ids(self) -> list[str]:
        """The tasks that have a log (deleted tasks' logs are purged)."""
        info = await self._jetstream().stream_info(EVENTS_STREAM, subjects_filter=f"{_PREFIX}>")
        subjects = info.state.subjects or {}
        return [s[len(_PREFIX) :] for s in subjects if s.startswith(_PREFIX)]

    async def last_entry(self, task_id: str) -> EventBase | None:
        """The task's latest entry (None: it has no log)."""
        try:
            msg = await self._jetstream().get_last_msg(EVENTS_STREAM, event_subject(task_id))
        except NotFoundError:
            return None
        return _parsed(task_id, msg.data)


def has_ended(last: EventBase) -> bool:
    """Whether a task whose latest entry is `last` ended (FINISHED, STOPPED, ERROR...): nothing
    comes for it until a person writes to it."""
    return isinstance(last, AgentStateChangedObservation) and last.agent_state in TERMINAL_STATES


def _parsed(task_id: str, data: bytes | None) -> EventBase:
    try:
        return EventAdapter.validate_json(data or b"")
    except ValidationError as exc:
        raise RebuildError(f"task {task_id}: an entry of its log is no event: {exc}") from exc
