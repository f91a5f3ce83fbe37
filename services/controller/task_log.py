"""Reading tasks' logs straight from JetStream, to rebuild States Redis lost.

Straight from the stream, not from the storage service: storage follows the stream a little
behind, and a State rebuilt from a log missing its last entries would log their seqs again.
A message of the stream is fetched by its subject (`next_by_subj`), one request per entry:
rebuilding is rare, and this needs only the stream's MSG.GET permission, no consumer.
"""

from __future__ import annotations

from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from shared.events import TERMINAL_STATES, AgentStateChangedObservation, EventAdapter, EventBase
from shared.subjects import EVENTS_STREAM, event_subject

from .rebuild import RebuildError

__all__ = ["TaskLog"]

_PREFIX = event_subject("*").removesuffix("*")  # "deckhands.events."


class TaskLog:
    def __init__(self, jetstream: Callable[[], JetStreamContext]) -> None:
        self._jetstream = jetstream

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
                entries.append(EventAdapter.validate_json(msg.data))
            if msg.seq is None:
                raise RebuildError(f"task {task_id}: the stream gave an entry without a seq")
            seq = msg.seq + 1

    async def task_ids(self) -> list[str]:
        """The tasks that have a log (deleted tasks' logs are purged)."""
        info = await self._jetstream().stream_info(EVENTS_STREAM, subjects_filter=f"{_PREFIX}>")
        subjects = info.state.subjects or {}
        return [s[len(_PREFIX) :] for s in subjects if s.startswith(_PREFIX)]

    async def has_ended(self, task_id: str) -> bool:
        """Whether the task's last entry ended it (FINISHED, STOPPED, ERROR...): nothing will
        come for it until a person writes to it."""
        try:
            msg = await self._jetstream().get_last_msg(EVENTS_STREAM, event_subject(task_id))
        except NotFoundError:
            return True
        if not msg.data:
            return False
        last = EventAdapter.validate_json(msg.data)
        return (
            isinstance(last, AgentStateChangedObservation) and last.agent_state in TERMINAL_STATES
        )
