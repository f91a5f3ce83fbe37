"""Sandbox seats on a real Redis: the Lua scripts that admit, queue, pump and release, and the
fair order between tenants (weights) and within one (interactive before batch)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from shared.admission import WEIGHTS_KEY, SandboxSeats, queue_place, queue_position


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
    assert await seats.pump() == ([], [])  # no free seat

    assert await seats.release("a")
    # A newcomer does not jump the queue while someone waits...
    e = await seats.admit("e", order("e"))
    assert not e.seated and [s.task_id for s in e.seatings] == ["c"]
    # ...the head takes the freed seat, and its order is handed back to be sent again.
    assert await seats.pump() == ([order("c")], [])
    assert await seats.position("c") is None and await seats.position("d") == 1
    assert (await seats.admit("c")).seated
    await seats.handled("c")
    assert (await seats.pump(resend_after_s=0))[0] == []  # handled: not sent again


async def test_an_order_not_handled_after_seating_is_sent_again(seats: SandboxSeats) -> None:
    for task in "abc":
        await seats.admit(task, order(task))
    await seats.release("a")
    assert (await seats.pump(resend_after_s=0.2))[0] == [order("c")]
    assert (await seats.pump(resend_after_s=0.2))[0] == []  # not yet due again
    await asyncio.sleep(0.3)
    assert (await seats.pump(resend_after_s=0.2))[0] == [order("c")]  # the sender died: again


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
    assert await seats.pump() == ([], [])  # 2 seats taken of 2: still no room
    await seats.release("b")
    assert (await seats.pump())[0] == [order("d")]


async def test_concurrent_admissions_never_give_more_seats_than_exist(
    seats: SandboxSeats,
) -> None:
    results = await asyncio.gather(*(seats.admit(f"t{i}", order(f"t{i}")) for i in range(50)))
    assert sum(r.seated for r in results) == 2
    assert sorted(r.position for r in results if not r.seated) == list(range(1, 49))


@pytest.fixture
async def pool(redis_url: str) -> AsyncIterator[SandboxSeats]:
    """Six seats, and three tenants' weights (removed after)."""
    redis = Redis.from_url(redis_url)
    suffix = uuid.uuid4().hex[:6]
    try:
        yield SandboxSeats(redis, f"test-{suffix}", max_seats=6)
    finally:
        await redis.aclose()


async def queue_tenants(
    seats: SandboxSeats, counts: dict[str, int], batch: bool = False
) -> list[str]:
    """Queue `counts[tenant]` tasks per tenant, interleaved in arrival; their ids."""
    ids: list[str] = []
    for i in range(max(counts.values())):
        for tenant, count in counts.items():
            if i < count:
                task = f"{tenant}-{i}"
                ids.append(task)
                await seats.admit(task, order(task), tenant_id=tenant, batch=batch)
    return ids


async def seat_one_by_one(seats: SandboxSeats, count: int) -> list[str]:
    """Free one seat at a time (of a task nobody queued behind) and record who takes it."""
    taken: list[str] = []
    for _ in range(count):
        holders = list(await seats.seated())
        await seats.release(holders[0])
        _, seated = await seats.pump()
        taken += [s.task_id for s in seated]
    return taken


async def test_a_tenant_alone_uses_every_seat(pool: SandboxSeats) -> None:
    results = [await pool.admit(f"t{i}", order(f"t{i}"), tenant_id="solo") for i in range(8)]
    assert [r.seated for r in results] == [True] * 6 + [False] * 2
    assert await pool.tenants() == {"solo": (6, 2)}
    assert [r.position for r in results[6:]] == [1, 2]


async def test_seats_follow_the_weights_of_three_tenants_queueing_at_once(
    pool: SandboxSeats,
) -> None:
    # Six seats held by a fourth tenant; three tenants weighted 3:2:1 queue 12 tasks each.
    await pool.redis.hset(WEIGHTS_KEY, mapping={"heavy": 3, "middle": 2})
    try:
        for i in range(6):
            await pool.admit(f"busy-{i}", order(f"busy-{i}"), tenant_id="busy")
        await queue_tenants(pool, {"light": 12, "middle": 12, "heavy": 12})
        # The positions they are told agree with the order they are then seated in.
        told = {
            task: (await queue_place(pool.redis, pool.pool_name, task)).position  # type: ignore[union-attr]
            for task in ("heavy-0", "middle-0", "light-0", "heavy-3", "light-2")
        }
        taken = await seat_one_by_one(pool, 6)  # the busy tenant's seats free one by one
        per = {t: sum(task.startswith(t) for task in taken) for t in ("heavy", "middle", "light")}
        assert per == {"heavy": 3, "middle": 2, "light": 1}, taken
        # While all three queue, each freed seat keeps them at 3:2:1.
        assert (await pool.tenants())["heavy"] == (3, 9)
        for task, position in told.items():
            if task in taken:
                assert position == taken.index(task) + 1, (task, told, taken)
    finally:
        await pool.redis.hdel(WEIGHTS_KEY, "heavy", "middle")


async def test_an_idle_tenants_share_goes_to_those_who_wait(pool: SandboxSeats) -> None:
    await pool.redis.hset(WEIGHTS_KEY, "idle-heavy", 5)
    try:
        await queue_tenants(pool, {"a": 10, "b": 10})
        assert await pool.tenants() == {"a": (3, 7), "b": (3, 7)}  # equal weights: 3 and 3
    finally:
        await pool.redis.hdel(WEIGHTS_KEY, "idle-heavy")


async def test_a_flood_does_not_hold_back_a_quiet_tenant(pool: SandboxSeats) -> None:
    await queue_tenants(pool, {"flood": 300})
    quiet = [
        await pool.admit(f"quiet-{i}", order(f"quiet-{i}"), tenant_id="quiet") for i in range(3)
    ]
    assert [q.position for q in quiet] == [1, 2, 3]  # ahead of 294 flood tasks
    taken = await seat_one_by_one(pool, 3)
    assert taken == ["quiet-0", "quiet-1", "quiet-2"]


async def test_interactive_tasks_go_ahead_of_their_tenants_batch_ones(pool: SandboxSeats) -> None:
    await queue_tenants(pool, {"team": 20}, batch=True)  # 6 seated, 14 queued
    late = [await pool.admit(f"now-{i}", order(f"now-{i}"), tenant_id="team") for i in range(2)]
    assert [p.position for p in late] == [1, 2]
    assert await pool.position("team-6") == 3
    assert await seat_one_by_one(pool, 3) == ["now-0", "now-1", "team-6"]


async def test_the_estimate_follows_the_rate_seats_free_at(pool: SandboxSeats) -> None:
    await queue_tenants(pool, {"t": 10})
    place = await queue_place(pool.redis, pool.pool_name, "t-9")
    assert place is not None and place.position == 4 and place.estimate_s is None
    for _ in range(3):
        await seat_one_by_one(pool, 1)
        await asyncio.sleep(0.2)
    place = await queue_place(pool.redis, pool.pool_name, "t-9")
    assert place is not None and place.position == 1
    # Three releases over about 0.4 s: about 0.2 s a seat.
    assert place.estimate_s is not None and 0.05 <= place.estimate_s <= 1.0


async def test_release_and_hold_keep_each_tenants_count(pool: SandboxSeats) -> None:
    await queue_tenants(pool, {"a": 4, "b": 4})
    await pool.hold("adopted", "c")  # above the maximum: counted all the same
    assert await pool.tenants() == {"a": (3, 1), "b": (3, 1), "c": (1, 0)}
    assert await pool.release("a-0") and not await pool.release("a-3")  # queued: just leaves
    assert await pool.release("adopted")
    assert await pool.tenants() == {"a": (2, 0), "b": (3, 1)}
    _, seated = await pool.pump()
    assert [s.task_id for s in seated] == ["b-3"] and seated[0].tenant_id == "b"
    assert seated[0].waited_s > 0


async def test_concurrent_tenants_never_get_more_seats_than_exist(pool: SandboxSeats) -> None:
    results = await asyncio.gather(
        *(pool.admit(f"t{i}", order(f"t{i}"), tenant_id=f"x{i % 5}") for i in range(60))
    )
    assert sum(r.seated for r in results) == 6
    taken, queued = await pool.counts()
    assert (taken, queued) == (6, 54)
    assert sum(held for held, _ in (await pool.tenants()).values()) == 6


@pytest.fixture
async def paced(redis_url: str) -> AsyncIterator[SandboxSeats]:
    """A hundred seats, given two at a time as sandboxes start."""
    redis = Redis.from_url(redis_url)
    try:
        yield SandboxSeats(
            redis, f"test-{uuid.uuid4().hex[:8]}", max_seats=100, max_starting=2, start_stale_s=0.5
        )
    finally:
        await redis.aclose()


async def test_seats_go_at_the_pace_sandboxes_start(paced: SandboxSeats) -> None:
    flood = [await paced.admit(f"f{i}", order(f"f{i}"), tenant_id="flood") for i in range(5)]
    assert [a.seated for a in flood] == [True, True, False, False, False]  # seats free, yet
    assert await paced.starting() == 2
    # A tenant that comes during the flood, with no sandbox starting, takes a free seat at once:
    # a start slot of its own, past the pace.
    assert (await paced.admit("q0", order("q0"), tenant_id="quiet")).seated
    assert await paced.starting() == 3
    # Its next task waits for a start like anyone's, and goes first (it holds fewer seats).
    quiet = await paced.admit("q1", order("q1"), tenant_id="quiet")
    assert not quiet.seated and quiet.position == 1
    assert await paced.started("f0")
    assert not await paced.started("f0")  # once
    assert await paced.pump() == ([], [])  # f1 and q0 still start: the pace holds
    assert await paced.started("q0")
    orders, seated = await paced.pump()
    assert [s.task_id for s in seated] == ["q1"] and orders == [order("q1")]
    assert await paced.counts() == (4, 3)  # f0 and q0 keep their seats: their sandboxes run
    # A seat held by a sandbox that runs already (adopted) never waits for a start.
    await paced.hold("elsewhere", "quiet")
    assert await paced.starting() == 2
    # Released while starting: the start slot frees with the seat.
    await paced.release("f1")
    _, seated = await paced.pump()
    assert [s.task_id for s in seated] == ["f2"]


async def test_a_start_its_replica_never_finished_stops_counting(paced: SandboxSeats) -> None:
    for i in range(3):
        await paced.admit(f"t{i}", order(f"t{i}"))
    assert await paced.pump() == ([], [])
    await asyncio.sleep(0.6)  # past start_stale_s: their replica died mid-start
    _, seated = await paced.pump()
    assert [s.task_id for s in seated] == ["t2"]


async def test_a_preparation_never_replaces_a_kept_action(paced: SandboxSeats) -> None:
    for i in range(2):
        await paced.admit(f"t{i}", order(f"t{i}"))
    # The task's action queued first; its preparation, late, must not take the action's place.
    assert not (await paced.admit("late", order("late-action"))).seated
    assert not (await paced.admit("late", order("late-prepare"), weak=True)).seated
    await paced.started("t0")
    assert (await paced.pump())[0] == [order("late-action")]
    # A preparation seated at once is handled then (nothing to send again)...
    await paced.started("t1")
    assert (await paced.admit("fresh", order("fresh-prepare"), weak=True)).seated
    assert (await paced.pump())[0] == []  # (late's action is due again only in 10 s)
    # ...while an action kept before a preparation that is seated is sent again.
    await paced.release("late")
    assert (await paced.admit("filler", order("filler"))).seated  # the slot late left
    assert not (await paced.admit("both", order("both-action"))).seated
    await paced.started("fresh")
    assert (await paced.admit("both", order("both-prepare"), weak=True)).seated
    assert (await paced.pump())[0] == [order("both-action")]


async def test_an_order_sent_again_is_sent_once(paced: SandboxSeats) -> None:
    """A preparation seated from the queue, and then found with its sandbox running, is
    forgotten: the pump sent it again every 10 s for as long as the task ran. So is an action
    that comes back after its task's preparation started the sandbox."""
    for i in range(2):
        await paced.admit(f"t{i}", order(f"t{i}"))
    assert not (await paced.admit("p", order("p-prepare"), weak=True)).seated
    await paced.started("t0")
    orders, _ = await paced.pump(resend_after_s=0)
    assert orders == [order("p-prepare")]
    # The sandbox runs already when the preparation comes back (its first action was first).
    await paced.handled_order("p", order("p-prepare"))
    assert (await paced.pump(resend_after_s=0))[0] == []
    # Or the preparation comes back while the task is seated: the seat's check forgets it.
    assert not (await paced.admit("q", order("q-prepare"), weak=True)).seated
    await paced.started("t1")
    assert (await paced.pump(resend_after_s=0))[0] == [order("q-prepare")]
    assert (await paced.admit("q", order("q-prepare"), weak=True)).seated
    assert (await paced.pump(resend_after_s=0))[0] == []
    # An action kept before the preparation that was seated: sent again until it is handled.
    await paced.started("p")
    await paced.started("q")
    for i in range(2, 4):
        await paced.admit(f"t{i}", order(f"t{i}"))
    assert not (await paced.admit("a", order("a-action"))).seated
    assert not (await paced.admit("a", order("a-prepare"), weak=True)).seated
    await paced.started("t2")
    assert (await paced.pump(resend_after_s=0))[0] == [order("a-action")]
    assert (await paced.pump(resend_after_s=0))[0] == [order("a-action")]  # not handled yet
    await paced.handled_order("a", order("a-prepare"))  # not the one kept: stays
    assert (await paced.pump(resend_after_s=0))[0] == [order("a-action")]
    await paced.handled_order("a", order("a-action"))
    assert (await paced.pump(resend_after_s=0))[0] == []


async def test_a_burst_and_a_backlog_leave_the_warm_sandboxes_to_who_comes_next(
    paced: SandboxSeats,
) -> None:
    # Alone on an idle pool: nobody waits behind it, the warm sandboxes are its to take.
    assert (await paced.admit("lone", order("lone"), tenant_id="flood")).seated
    assert not (await paced.seat_of("lone")).leaves_warm
    await paced.release("lone")
    # A flood: its first task takes a warm sandbox; the next, seated while the first still
    # starts, leaves them (the rest of a burst); the backlog builds after.
    flood = [await paced.admit(f"f{i}", order(f"f{i}"), tenant_id="flood") for i in range(6)]
    assert [a.seated for a in flood] == [True, True, False, False, False, False]
    assert not (await paced.seat_of("f0")).leaves_warm
    assert (await paced.seat_of("f1")).leaves_warm
    # Another tenant's task goes ahead of the flood's backlog: a warm sandbox is for it.
    assert (await paced.admit("q0", order("q0"), tenant_id="quiet")).seated
    assert not (await paced.seat_of("q0")).leaves_warm
    # A tenant's batch and its interactive tasks each have a start slot of their own past the
    # pace: an interactive task waits for no start of its tenant's batch, and takes a warm one.
    batch = [
        await paced.admit(f"b{i}", order(f"b{i}"), tenant_id="team", batch=True) for i in range(2)
    ]
    assert [b.seated for b in batch] == [True, False]
    assert (await paced.admit("urgent", order("urgent"), tenant_id="team")).seated
    assert not (await paced.seat_of("urgent")).leaves_warm
    assert not (await paced.admit("urgent2", order("urgent2"), tenant_id="team")).seated
    # The head of the flood's backlog, seated in arrival order while the rest of it queues,
    # leaves them; its release forgets it.
    for task in ("f0", "f1", "q0"):
        await paced.started(task)
    _, seated = await paced.pump()
    assert "f2" in {s.task_id for s in seated} and (await paced.seat_of("f2")).leaves_warm
    await paced.release("f2")
    assert not (await paced.seat_of("f2")).leaves_warm
