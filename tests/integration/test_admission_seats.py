"""Sandbox seats on a real Redis: the Lua scripts that admit, queue, pump and release."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared.admission import SandboxSeats, queue_position


@pytest.fixture
async def seats(redis_url: str) -> AsyncIterator[SandboxSeats]:
    redis = Redis.from_url(redis_url)
    try:
        yield SandboxSeats(redis, f"test-{uuid.uuid4().hex[:8]}", max_seats=2)
    finally:
        await redis.aclose()


def order(task: str) -> str:
    return json.dumps({"task_id": task})


async def test_tasks_beyond_the_seats_queue_in_arrival_order(seats: SandboxSeats) -> None:
    assert (await seats.admit("a", order("a"))).seated
    assert (await seats.admit("b", order("b"))).seated
    assert (await seats.admit("a")).seated  # holding a seat already
    c = await seats.admit("c", order("c"))
    d = await seats.admit("d", order("d"))
    assert (c.seated, c.position, d.seated, d.position) == (False, 1, False, 2)
    assert (await seats.admit("c", order("c"))).position == 1  # asking again keeps the place
    assert await seats.position("d") == 2
    assert await queue_position(seats.redis, seats.pool_name, "d") == 2
    assert await seats.counts() == (2, 2)
    assert await seats.pump() == []  # no free seat

    assert await seats.release("a")
    # A newcomer does not jump the queue while someone waits...
    assert not (await seats.admit("e", order("e"))).seated
    # ...the head takes the freed seat, and its order is handed back to be sent again.
    assert await seats.pump() == [order("c")]
    assert await seats.position("c") is None and await seats.position("d") == 1
    assert (await seats.admit("c")).seated
    await seats.handled("c")
    assert await seats.pump(resend_after_s=0) == []  # handled: not sent again


async def test_an_order_not_handled_after_seating_is_sent_again(seats: SandboxSeats) -> None:
    for task in "abc":
        await seats.admit(task, order(task))
    await seats.release("a")
    assert await seats.pump(resend_after_s=0.2) == [order("c")]
    assert await seats.pump(resend_after_s=0.2) == []  # not yet due again
    await asyncio.sleep(0.3)
    assert await seats.pump(resend_after_s=0.2) == [order("c")]  # the sender died: again


async def test_release_of_a_queued_task_leaves_the_queue(seats: SandboxSeats) -> None:
    for task in "abcd":
        await seats.admit(task, order(task))
    assert not await seats.release("c")  # it held no seat
    assert await seats.position("d") == 1


async def test_held_seats_count_even_above_the_maximum(seats: SandboxSeats) -> None:
    for task in "abc":
        await seats.hold(task)  # adopted after a restart with fewer seats
    assert await seats.counts() == (3, 0)
    assert not (await seats.admit("d", order("d"))).seated
    await seats.release("a")
    assert await seats.pump() == []  # 2 seats taken of 2: still no room
    await seats.release("b")
    assert await seats.pump() == [order("d")]


async def test_concurrent_admissions_never_give_more_seats_than_exist(
    seats: SandboxSeats,
) -> None:
    results = await asyncio.gather(*(seats.admit(f"t{i}", order(f"t{i}")) for i in range(50)))
    assert sum(r.seated for r in results) == 2
    assert sorted(r.position for r in results if not r.seated) == list(range(1, 49))
