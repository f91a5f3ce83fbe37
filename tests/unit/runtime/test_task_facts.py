"""TaskFacts: a task's creation-time facts read once per task, an absence only for a while."""

from __future__ import annotations

import asyncio

from services.runtime.task_facts import TaskFacts


class Records:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.reads = 0

    async def read(self, task_id: str) -> str | None:
        self.reads += 1
        return self.values.get(task_id)


async def test_a_fact_is_read_once_and_kept() -> None:
    records = Records()
    records.values["t1"] = "repo"
    facts = TaskFacts(records.read)
    assert [await facts.get("t1") for _ in range(5)] == ["repo"] * 5
    assert records.reads == 1


async def test_an_absence_is_read_again_once_it_is_old() -> None:
    records = Records()
    facts = TaskFacts(records.read, absent_ttl_s=0.05)
    assert await facts.get("t1") is None
    assert await facts.get("t1") is None
    assert records.reads == 1  # kept for a while...
    records.values["t1"] = "grant"  # (a Redis that lost its data, filled again)
    await asyncio.sleep(0.06)
    assert await facts.get("t1") == "grant"  # ...then read again
    assert records.reads == 2


async def test_the_oldest_task_is_forgotten_beyond_the_bound_and_forget_drops_one() -> None:
    records = Records()
    records.values.update({"a": "1", "b": "2", "c": "3"})
    facts = TaskFacts(records.read, max_tasks=2)
    for task_id in ("a", "b", "c"):
        await facts.get(task_id)
    await facts.get("a")  # dropped as the oldest: read again
    assert records.reads == 4
    facts.forget("c")
    await facts.get("c")
    assert records.reads == 5
