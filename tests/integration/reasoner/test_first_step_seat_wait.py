"""A queued task's first LLM call waits for its seat (services/reasoner/seat_wait.py), read from
the seats and queue the runtime keeps (shared/admission.py's SandboxSeats, on the session's
real redis-server): a seated task, or one that comes while nobody queues, goes on at once."""

from __future__ import annotations

import asyncio
import time
import uuid

from redis.asyncio import Redis

from services.reasoner.seat_wait import SeatWait, may_think
from shared.admission import ANNOUNCED_FOR_S, SandboxSeats
from shared.seat_states import PoolSeats, SeatState, seat_states


def _pool() -> str:
    return f"seat-wait-{uuid.uuid4().hex[:8]}"


def _wait(redis: Redis, pool: str, **overrides: float) -> SeatWait:
    values = {"max_held": 8, "max_wait_s": 10.0, "unseen_grace_s": 0.5, "poll_s": 0.02}
    values.update(overrides)
    return SeatWait(
        redis,
        pool,
        max_held=int(values["max_held"]),
        max_wait_s=values["max_wait_s"],
        unseen_grace_s=values["unseen_grace_s"],
        poll_s=values["poll_s"],
    )


async def _one_seat_taken(
    redis: Redis, queued: tuple[str, ...] = ("b",)
) -> tuple[str, SandboxSeats]:
    """A pool of one seat that a runtime runs (it says so every second): task `a` seated, the
    `queued` ones queued."""
    pool = _pool()
    seats = SandboxSeats(redis, pool, max_seats=1)
    await seats.announce()
    assert (await seats.admit("a", tenant_id="t")).seated
    for task in queued:
        assert not (await seats.admit(task, tenant_id="t")).seated
    return pool, seats


def test_who_may_think() -> None:
    running = PoolSeats(queued=0, held=1, max_seats=4)
    queueing = PoolSeats(queued=5, held=4, max_seats=4)
    no_runtime = PoolSeats(queued=3, held=9, max_seats=None)  # none said it runs the pool
    assert may_think(SeatState.SEATED, queueing, waited_s=0.0)
    assert may_think(SeatState.UNSEEN, no_runtime, waited_s=0.0)
    assert may_think(SeatState.QUEUED, no_runtime, waited_s=0.0)
    assert not may_think(SeatState.QUEUED, queueing, waited_s=1000.0)
    # Queued only for its turn among the starts (seats free for the whole queue): it thinks
    # while its sandbox waits to start.
    pacing = PoolSeats(queued=30, held=10, max_seats=100)
    assert may_think(SeatState.QUEUED, pacing, waited_s=0.0)
    assert not may_think(SeatState.QUEUED, PoolSeats(queued=91, held=10, max_seats=100), 0.0)
    for pool in (running, queueing):  # the runtime seats or queues it within the grace
        assert not may_think(SeatState.UNSEEN, pool, waited_s=1.0, unseen_grace_s=5.0)
        assert may_think(SeatState.UNSEEN, pool, waited_s=5.0, unseen_grace_s=5.0)


async def test_the_states_come_from_the_runtimes_seats(redis: Redis) -> None:
    pool = _pool()
    seats = SandboxSeats(redis, pool, max_seats=1)
    assert (await seats.admit("a", tenant_id="t")).seated
    assert not (await seats.admit("b", tenant_id="t")).seated
    said, states = await seat_states(redis, pool, ["a", "b", "c"])
    assert said == PoolSeats(queued=1, held=1, max_seats=None)
    assert states == {"a": SeatState.SEATED, "b": SeatState.QUEUED, "c": SeatState.UNSEEN}
    await seats.announce()
    said, _ = await seat_states(redis, pool, [])
    assert said == PoolSeats(queued=1, held=1, max_seats=1)
    assert 0 < await redis.ttl(f"deckhands:seats:{pool}:max_seats") <= ANNOUNCED_FOR_S


async def test_a_seated_task_goes_on_at_once_and_an_unseen_one_once_seen(redis: Redis) -> None:
    pool = _pool()
    seats = SandboxSeats(redis, pool, max_seats=2)
    wait = _wait(redis, pool, unseen_grace_s=30.0)
    try:
        assert await wait.until_seated("lone") == 0.0  # no runtime runs this pool (yet)
        await seats.announce()
        assert (await seats.admit("a", tenant_id="t")).seated
        assert await wait.until_seated("a") == 0.0
        # Its step came before the runtime had its PrepareSandbox: it waits to be seen.
        waiting = asyncio.create_task(wait.until_seated("b"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        assert (await seats.admit("b", tenant_id="t")).seated
        # Counted from its first read of the seats, a round trip after the sleep began.
        assert 0.1 <= await asyncio.wait_for(waiting, 1) < 0.5
    finally:
        await wait.close()


async def test_a_queued_task_thinks_once_it_is_seated(redis: Redis) -> None:
    pool, seats = await _one_seat_taken(redis)
    wait = _wait(redis, pool)
    try:
        waiting = asyncio.create_task(wait.until_seated("b"))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # queued: its LLM call waits
        await seats.release("a")
        await seats.pump()  # the runtime seats the next in the fair order
        assert (await seat_states(redis, pool, ["b"]))[1]["b"] is SeatState.SEATED
        waited = await asyncio.wait_for(waiting, 5)
        assert 0.5 <= waited < 3.0
    finally:
        await wait.close()


async def test_a_task_queued_only_for_its_start_thinks_at_once(redis: Redis) -> None:
    # Seats for everyone, but one sandbox starts at a time (max_starting): `b` is queued for
    # its turn to start, not for a seat, so its first LLM call runs meanwhile.
    pool = _pool()
    seats = SandboxSeats(redis, pool, max_seats=4, max_starting=1)
    await seats.announce()
    assert (await seats.admit("a", tenant_id="t")).seated
    assert not (await seats.admit("b", tenant_id="t")).seated
    assert (await seat_states(redis, pool, ["b"]))[1]["b"] is SeatState.QUEUED
    wait = _wait(redis, pool)
    try:
        assert await asyncio.wait_for(wait.until_seated("b"), 1) == 0.0
    finally:
        await wait.close()


async def test_a_task_the_runtime_has_not_seen_waits_only_the_grace(redis: Redis) -> None:
    pool, _ = await _one_seat_taken(redis)
    wait = _wait(redis, pool, unseen_grace_s=0.5)
    try:
        began = time.monotonic()
        waited = await asyncio.wait_for(wait.until_seated("never-prepared"), 5)
        assert 0.5 <= waited and time.monotonic() - began < 3.0
    finally:
        await wait.close()


async def test_the_waits_are_bounded_in_time_and_in_number(redis: Redis) -> None:
    pool, _ = await _one_seat_taken(redis, queued=("b", "c"))
    wait = _wait(redis, pool, max_held=1, max_wait_s=0.6)
    try:
        first = asyncio.create_task(wait.until_seated("b"))
        await asyncio.sleep(0.1)
        # The replica holds one already: the next thinks at once rather than hold a worker.
        assert await asyncio.wait_for(wait.until_seated("c"), 1) == 0.0
        waited = await asyncio.wait_for(first, 5)  # never seated: its wait ends
        assert 0.6 <= waited < 3.0
    finally:
        await wait.close()
