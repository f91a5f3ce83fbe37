"""Listing a tenant's tasks on a real redis-server: the index's order and cursor, creation-time
bounds, state and label filters, the scan budget; and the blobs a deletion finds in a log."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from services.gateway.errors import InvalidCursor
from services.gateway.tasks.deletion import blob_refs
from services.gateway.tasks.listing import SCAN_BUDGET, TaskListing, TaskQuery
from services.gateway.tasks.records import TaskRecord, TaskRecords, decode_cursor, encode_cursor
from shared.events import AgentState, new_id
from shared.state import TaskState
from shared.state_store import TaskStateStore

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Tasks:
    """Tasks of one tenant made straight in Redis, under a prefix of the test's own."""

    def __init__(self, redis: Redis) -> None:
        prefix = f"test-{new_id()}"
        self.store = TaskStateStore(redis, prefix=prefix)
        self.records = TaskRecords(redis, prefix=prefix)
        self.listing = TaskListing(self.store, self.records)

    async def add(
        self,
        minute: int,
        *,
        tenant: str = "acme",
        state: AgentState = AgentState.RUNNING,
        labels: tuple[str, ...] = (),
    ) -> str:
        task_id = new_id()
        at = T0 + timedelta(minutes=minute)
        await self.records.put(task_id, TaskRecord(tenant_id=tenant, labels=labels, created_at=at))
        await self.store.create(
            TaskState(
                task_id=task_id,
                task=f"t{minute}",
                max_iterations=1,
                agent_state=state,
                created_at=at,
            )
        )
        return task_id

    async def ids(self, query: TaskQuery, tenant: str = "acme") -> tuple[list[str], str | None]:
        page = await self.listing.page(tenant, query)
        return [state.task_id for state, _ in page.tasks], page.next_cursor

    async def all_pages(self, query: TaskQuery) -> list[list[str]]:
        pages = []
        while True:
            ids, cursor = await self.ids(query)
            pages.append(ids)
            if cursor is None:
                return pages
            query = TaskQuery(**{**query.__dict__, "cursor": cursor})


@pytest.fixture
def tasks(redis: Redis) -> Tasks:
    return Tasks(redis)


async def test_newest_first_a_page_at_a_time(tasks: Tasks) -> None:
    made = [await tasks.add(minute) for minute in range(7)]
    await tasks.add(3, tenant="globex")  # another tenant's: never listed
    assert await tasks.all_pages(TaskQuery(limit=3)) == [
        made[6:3:-1],
        made[3:0:-1],
        made[0:1],
    ]
    ids, cursor = await tasks.ids(TaskQuery(limit=7))
    assert ids == made[::-1] and cursor is None  # exactly one page: no cursor


async def test_creation_time_bounds_are_exclusive(tasks: Tasks) -> None:
    made = [await tasks.add(minute) for minute in range(6)]
    query = TaskQuery(
        created_after=T0 + timedelta(minutes=1), created_before=T0 + timedelta(minutes=4)
    )
    assert (await tasks.ids(query))[0] == [made[3], made[2]]
    paged = TaskQuery(**{**query.__dict__, "limit": 1})
    assert await tasks.all_pages(paged) == [[made[3]], [made[2]]]


async def test_states_are_any_of_labels_are_all_of(tasks: Tasks) -> None:
    a = await tasks.add(0, state=AgentState.FINISHED, labels=("team=a", "nightly"))
    b = await tasks.add(1, state=AgentState.RUNNING, labels=("team=a",))
    c = await tasks.add(2, state=AgentState.ERROR, labels=("team=b", "nightly"))
    done = frozenset({AgentState.FINISHED, AgentState.ERROR})
    assert (await tasks.ids(TaskQuery(states=done)))[0] == [c, a]
    assert (await tasks.ids(TaskQuery(labels=frozenset({"team=a"}))))[0] == [b, a]
    both = frozenset({"team=a", "nightly"})
    assert (await tasks.ids(TaskQuery(labels=both)))[0] == [a]
    assert (await tasks.ids(TaskQuery(labels=both, states=done)))[0] == [a]
    assert await tasks.all_pages(TaskQuery(limit=1, labels=frozenset({"nightly"}))) == [
        [c],
        [a],
    ]


async def test_a_deleted_or_half_made_task_is_skipped(tasks: Tasks, redis: Redis) -> None:
    kept = await tasks.add(0)
    gone = await tasks.add(1)
    await tasks.store.delete(gone)
    half = new_id()  # its creation died between the record and the State
    await tasks.records.put(half, TaskRecord(tenant_id="acme", created_at=T0))
    assert (await tasks.ids(TaskQuery()))[0] == [kept]


async def test_a_rare_match_among_many_ends_the_page_at_the_scan_budget(tasks: Tasks) -> None:
    for minute in range(SCAN_BUDGET + 5):
        await tasks.add(minute)
    rare = await tasks.add(-1, labels=("rare",))  # the oldest
    ids, cursor = await tasks.ids(TaskQuery(labels=frozenset({"rare"})))
    assert ids == [] and cursor is not None  # budget spent: go on from the cursor
    ids, cursor = await tasks.ids(TaskQuery(labels=frozenset({"rare"}), cursor=cursor))
    assert ids == [rare] and cursor is None


def test_a_cursor_is_opaque_and_checked() -> None:
    member = "0000000000000001:" + new_id()
    assert decode_cursor(encode_cursor(member)) == member
    for bad in ("", "!!!", encode_cursor("not a member"), encode_cursor("1:" + new_id())):
        with pytest.raises(InvalidCursor):
            decode_cursor(bad)


def test_a_deletion_finds_every_blob_the_log_names() -> None:
    events = [
        {"kind": "run_output", "content_ref": {"sha256": "a" * 64, "size": 1}},
        {"kind": "write", "content_ref": None},
        {"kind": "delegate", "outputs": {"nested": [{"content_ref": {"sha256": "b" * 64}}]}},
        {"kind": "message", "content": "content_ref"},
    ]
    assert blob_refs(events) == {"a" * 64, "b" * 64}
