"""The storage service's event log on a real SQLite file: group commits, gap-free byte-bounded
reads, duplicates and conflicts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.storage.event_log import EventLog
from services.storage.metrics import GROUP_SIZE
from shared.delivery import PermanentError


@pytest.fixture
async def log(tmp_path: Path) -> AsyncIterator[EventLog]:
    event_log = EventLog(tmp_path / "events.sqlite3")
    await event_log.open()
    try:
        yield event_log
    finally:
        await event_log.close()


def body(task_id: str, seq: int, pad: int = 0) -> str:
    return json.dumps({"task_id": task_id, "seq": seq, "pad": "x" * pad})


async def store(log: EventLog, task_id: str, seq: int, pad: int = 0) -> bool:
    return await log.append(task_id, seq, f"{task_id}-{seq}", "message", body(task_id, seq, pad))


def groups_committed() -> float:
    return next(
        s.value for m in GROUP_SIZE.collect() for s in m.samples if s.name.endswith("_count")
    )


async def test_events_stored_at_once_share_commits(log: EventLog) -> None:
    before = groups_committed()
    stored = await asyncio.gather(
        *(store(log, f"t{t}", seq) for t in range(20) for seq in range(1, 11))
    )
    assert all(stored)
    # 200 events, far fewer commits: each commit takes every event waiting for it.
    assert groups_committed() - before < 50
    for t in range(20):
        page = await log.read(f"t{t}", 0, 100, 1 << 20)
        assert [e["seq"] for e in page.events] == list(range(1, 11))
        assert page.last_seq == 10


async def test_a_read_stops_at_a_seq_not_yet_stored(log: EventLog) -> None:
    await store(log, "t", 1)
    await store(log, "t", 3)
    page = await log.read("t", 0, 100, 1 << 20)
    assert [e["seq"] for e in page.events] == [1]
    assert page.last_seq == 1  # nothing past the gap is readable yet
    assert (await log.read("t", 1, 100, 1 << 20)).events == []
    await store(log, "t", 2)
    page = await log.read("t", 1, 100, 1 << 20)
    assert [e["seq"] for e in page.events] == [2, 3]
    assert page.last_seq == 3


async def test_pages_are_bounded_in_bytes_and_always_carry_one_event(log: EventLog) -> None:
    for seq in range(1, 6):
        await store(log, "t", seq, pad=100_000)
    page = await log.read("t", 0, 100, 250_000)
    assert [e["seq"] for e in page.events] == [1, 2]
    assert page.last_seq == 5  # more to read
    one = await log.read("t", 2, 100, 1024)  # smaller than any event: one all the same
    assert [e["seq"] for e in one.events] == [3]
    assert (await log.read("t", 0, 3, 1 << 30)).events[-1]["seq"] == 3  # the count bound too


async def test_a_redelivery_is_a_duplicate_and_a_conflict_fails_alone(log: EventLog) -> None:
    assert await store(log, "t", 1) is True
    results = await asyncio.gather(
        store(log, "t", 1),  # the same event again
        log.append("t", 2, "other-id", "message", body("t", 2)),
        log.append("t", 2, "clash-id", "message", body("t", 2)),  # another event, same seq
        store(log, "u", 1),
        return_exceptions=True,
    )
    assert results[0] is False
    assert results[1] is True
    assert isinstance(results[2], PermanentError) and "conflicts" in str(results[2])
    assert results[3] is True  # the rest of the group was committed
    assert [e["seq"] for e in (await log.read("t", 0, 10, 1 << 20)).events] == [1, 2]


async def test_events_survive_reopening(tmp_path: Path) -> None:
    first = EventLog(tmp_path / "events.sqlite3")
    await first.open()
    await store(first, "t", 1)
    await first.close()
    again = EventLog(tmp_path / "events.sqlite3")
    await again.open()
    try:
        assert (await again.read("t", 0, 10, 1 << 20)).last_seq == 1
    finally:
        await again.close()


async def test_forgetting_a_task_removes_its_events_only_even_while_others_are_stored(
    log: EventLog,
) -> None:
    for seq in range(1, 6):
        await store(log, "doomed", seq)
    # Removal and group commits share the writer connection: run them side by side.
    removed, *stored = await asyncio.gather(
        log.forget("doomed"), *(store(log, "kept", seq) for seq in range(1, 51))
    )
    assert removed == 5 and all(stored)
    assert (await log.read("doomed", 0, 100, 1 << 20)).events == []
    assert len((await log.read("kept", 0, 100, 1 << 20)).events) == 50
    assert await log.forget("doomed") == 0
