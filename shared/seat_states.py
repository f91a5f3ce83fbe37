"""Where tasks stand for a sandbox seat, read by services other than the runtime (which alone
writes seats and the queue, shared/admission.py): seated, queued, or not seen yet; and whether
a runtime runs the pool."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from .seat_scripts import seats_prefix

__all__ = ["PoolSeats", "SeatState", "seat_states"]


class SeatState(enum.Enum):
    SEATED = "seated"
    QUEUED = "queued"
    UNSEEN = "unseen"  # the runtime has not seated or queued it (yet, or any more)


@dataclass(frozen=True)
class PoolSeats:
    queued: int
    held: int
    max_seats: int | None  # None: no runtime runs the pool (SandboxSeats.announce)


async def seat_states(
    redis: Redis, pool_name: str, task_ids: Sequence[str]
) -> tuple[PoolSeats, dict[str, SeatState]]:
    """The pool's queue and seats, and each of `task_ids`' state: one round trip."""
    prefix = seats_prefix(pool_name)
    pipe = redis.pipeline(transaction=False)
    pipe.zcard(f"{prefix}:queue")
    pipe.hlen(f"{prefix}:seats")
    pipe.get(f"{prefix}:max_seats")
    if task_ids:
        pipe.hmget(f"{prefix}:seats", list(task_ids))
    for task_id in task_ids:
        pipe.zscore(f"{prefix}:queue", task_id)
    replies = await pipe.execute()
    pool = PoolSeats(
        queued=int(replies[0]),
        held=int(replies[1]),
        max_seats=None if replies[2] is None else int(replies[2]),
    )
    states: dict[str, SeatState] = {}
    if task_ids:
        seats, queued = replies[3], replies[4:]
        for task_id, seat, place in zip(task_ids, seats, queued, strict=True):
            states[task_id] = (
                SeatState.SEATED
                if seat is not None
                else SeatState.QUEUED
                if place is not None
                else SeatState.UNSEEN
            )
    return pool, states
