"""The marker that says Redis lost nothing (shared/loss_marker.py), on a real redis-server: a
loss that strikes while a recovery pass puts things back is not hidden by the pass's end."""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from shared.loss_marker import LossMarker


def _marker(redis: Redis, ttl_s: int | None = None) -> LossMarker:
    return LossMarker(redis, f"deckhands:test-intact:{uuid.uuid4().hex}", ttl_s=ttl_s)


async def test_a_pass_that_ends_undisturbed_marks_redis_intact(redis: Redis) -> None:
    marker = _marker(redis)
    assert not await marker.intact()  # never marked: as after a FLUSHALL
    token = await marker.begin_pass()
    assert not await marker.intact()  # under way: not all is back yet
    assert await marker.end_pass(token)
    assert await marker.intact()
    await redis.delete(marker.key)


async def test_a_loss_during_the_pass_keeps_the_marker_off(redis: Redis) -> None:
    marker = _marker(redis)
    token = await marker.begin_pass()
    await redis.delete(marker.key)  # what FLUSHALL does to this key, mid-pass
    assert not await marker.end_pass(token)
    assert not await marker.intact()  # so the next check runs the pass again
    again = await marker.begin_pass()
    assert await marker.end_pass(again) and await marker.intact()
    await redis.delete(marker.key)


async def test_of_two_passes_side_by_side_the_later_one_marks(redis: Redis) -> None:
    marker = _marker(redis)
    first = await marker.begin_pass()
    second = await marker.begin_pass()  # another replica, after a loss the first missed
    assert not await marker.end_pass(first)
    assert not await marker.intact()
    assert await marker.end_pass(second) and await marker.intact()
    await redis.delete(marker.key)


async def test_a_marker_with_a_lifetime_keeps_it_through_the_pass(redis: Redis) -> None:
    marker = _marker(redis, ttl_s=600)
    token = await marker.begin_pass()
    assert 0 < await redis.ttl(marker.key) <= 600
    assert await marker.end_pass(token)
    assert 0 < await redis.ttl(marker.key) <= 600  # a runtime replica's marker dies with it
    await redis.delete(marker.key)
