"""GET /v1/tasks: a tenant's tasks, newest first, a page at a time, filtered by state, creation
time, labels and parent (of a fork).

The tenant's index (tasks/records.py) orders tasks by creation time and bounds a page by creation
time; state and labels are read from each candidate's State and record and filtered here. A
request looks at no more than SCAN_BUDGET candidates, so a filter that matches few of many
tasks cannot make one request read them all: it answers the matches so far and a cursor to go
on from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime

from redis.exceptions import RedisError

from shared.events import AgentState
from shared.state import TaskState
from shared.state_store import TaskStateStore

from ..errors import StorageUnavailable
from .records import IndexRange, TaskRecords, decode_cursor, encode_cursor

__all__ = ["SCAN_BUDGET", "TaskListing", "TaskPage", "TaskQuery"]

SCAN_BUDGET = 1_000
_BATCH = 200


@dataclass(frozen=True)
class TaskQuery:
    limit: int = 20
    cursor: str | None = None
    states: frozenset[AgentState] = frozenset()  # any of them; empty: every state
    labels: frozenset[str] = frozenset()  # all of them
    created_after: datetime | None = None
    created_before: datetime | None = None
    forked_from: str | None = None  # only the forks of this task


@dataclass(frozen=True)
class TaskPage:
    tasks: list[tuple[TaskState, tuple[str, ...]]]  # each State with its labels
    next_cursor: str | None


class TaskListing:
    def __init__(self, store: TaskStateStore, records: TaskRecords) -> None:
        self.store = store
        self.records = records

    async def page(self, tenant_id: str, query: TaskQuery) -> TaskPage:
        where = IndexRange(
            after_member=None if query.cursor is None else decode_cursor(query.cursor),
            created_after=query.created_after,
            created_before=query.created_before,
        )
        filtered = bool(query.states or query.labels or query.forked_from)
        try:
            await self.records.ensure_index(tenant_id)
            return await self._page(tenant_id, query, where, filtered)
        except RedisError as exc:
            raise StorageUnavailable(f"task state store (Redis) unavailable: {exc}") from exc

    async def _page(
        self, tenant_id: str, query: TaskQuery, where: IndexRange, filtered: bool
    ) -> TaskPage:
        found: list[tuple[TaskState, tuple[str, ...]]] = []
        examined = 0
        last: str | None = None
        while len(found) < query.limit and examined < SCAN_BUDGET:
            # Unfiltered, the page's own size (and one more, to know whether there is more).
            size = min(_BATCH, SCAN_BUDGET - examined) if filtered else query.limit + 1
            batch = await self.records.page(tenant_id, where, size)
            if not batch:
                return TaskPage(found, None)
            ids = [task_id for task_id, _ in batch]
            states = await self.store.load_many(ids)
            records = await self.records.get_many(ids)
            for (_, member), state, record in zip(batch, states, records, strict=True):
                if len(found) == query.limit:
                    return TaskPage(found, encode_cursor(last) if last else None)
                examined += 1
                last = member
                # No State: deleted, or its creation died half-way; no record: not listed.
                if state is None or record is None:
                    continue
                if query.states and state.agent_state not in query.states:
                    continue
                if not query.labels <= set(record.labels):
                    continue
                if query.forked_from is not None and state.forked_from != query.forked_from:
                    continue
                found.append((state, record.labels))
            if len(batch) < size:
                return TaskPage(found, None)  # the index has no more
            where = dataclasses.replace(where, after_member=last)
        return TaskPage(found, None if last is None else encode_cursor(last))
