"""A task queued for a sandbox seat asks the LLM for its first step once it is seated.

A burst of tasks (a tenant's 300 at once, with 100 seats) used to make 300 first LLM calls,
reviews and orders at once, though 200 of those tasks could run nothing until seats freed: on
2 cores that work delayed every other tenant's steps by seconds at each hop. Held here, the
queued tasks' first calls come as they are seated, while their sandboxes start; a task that is
seated goes on at once, one the runtime has not seen yet once it is (milliseconds on an idle
system). A queue the free seats can hold (a burst right after start, 40 tasks for 100 seats,
seated at the pace sandboxes start) holds nobody: each first call runs while its sandbox
waits for its turn to start, and a burst's last sandbox is ready when its first action is.

Bounded so that it can neither deadlock nor lose work: at most `max_held` steps wait at once
in a replica (the rest of its step workers stay free for the seated tasks' steps, which free
the seats), none longer than `max_wait_s`, and a task the runtime has not seen (its
PrepareSandbox still on its way, or lost) at most `unseen_grace_s`. Every waiter is checked in
one Redis round trip per `poll_s` (a tenth of it while one is unseen: the runtime seats or
queues it within milliseconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.seat_states import PoolSeats, SeatState, seat_states

from .metrics import FIRST_STEP_SEAT_WAIT, FIRST_STEPS_HELD

__all__ = ["SeatWait", "may_think"]

log = logging.getLogger("deckhands.reasoner")

POLL_S = 0.1
UNSEEN_GRACE_S = 5.0


def may_think(
    state: SeatState, pool: PoolSeats, waited_s: float, unseen_grace_s: float = UNSEEN_GRACE_S
) -> bool:
    """Whether a task's first step may ask the LLM now: seated; queued while the free seats
    hold the whole queue (it waits only for its turn among the sandbox starts, which go at the
    engine's pace, max_starting_sandboxes: its first LLM call is then the time its sandbox
    takes to start, as for a seated task); not seen by the runtime for longer than the grace
    (it may never be: its order lost); or no runtime runs the pool (a reasoner of another
    pool name, a runtime that is down). A task not seen yet waits for the runtime to seat or
    queue it: a step often reaches the reasoner first."""
    if state is SeatState.SEATED or pool.max_seats is None:
        return True
    if state is SeatState.QUEUED:
        return pool.held + pool.queued <= pool.max_seats
    return waited_s >= unseen_grace_s


@dataclass
class _Waiter:
    since: float
    ready: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class SeatWait:
    def __init__(
        self,
        redis: Redis,
        pool_name: str,
        *,
        max_held: int,
        max_wait_s: float,
        unseen_grace_s: float = UNSEEN_GRACE_S,
        poll_s: float = POLL_S,
    ) -> None:
        self.redis = redis
        self.pool_name = pool_name
        self.max_held = max_held
        self.max_wait_s = max_wait_s
        self.unseen_grace_s = unseen_grace_s
        self.poll_s = poll_s
        self._waiting: dict[str, _Waiter] = {}
        self._poller: asyncio.Task[None] | None = None

    async def until_seated(self, task_id: str) -> float:
        """Return once the task may think (see the module); the seconds it waited."""
        if self.max_wait_s <= 0 or task_id in self._waiting:
            return 0.0
        try:
            pool, states = await seat_states(self.redis, self.pool_name, [task_id])
        except RedisError as exc:
            log.warning("task %s: its seat could not be read (%s): thinking now", task_id, exc)
            return 0.0
        if may_think(states[task_id], pool, 0.0, self.unseen_grace_s):
            return 0.0
        if len(self._waiting) >= self.max_held:
            FIRST_STEPS_HELD.labels("not_held_replica_full").inc()
            return 0.0
        waiter = self._waiting[task_id] = _Waiter(time.monotonic())
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="first-step seat wait")
        try:
            await asyncio.wait_for(asyncio.shield(waiter.ready), self.max_wait_s)
            FIRST_STEPS_HELD.labels("seated").inc()
        except TimeoutError:
            FIRST_STEPS_HELD.labels("timed_out").inc()
        finally:
            del self._waiting[task_id]
        waited = time.monotonic() - waiter.since
        FIRST_STEP_SEAT_WAIT.observe(waited)
        return waited

    async def _poll(self) -> None:
        unseen = True
        while self._waiting:
            await asyncio.sleep(self.poll_s / 10 if unseen else self.poll_s)
            ids = list(self._waiting)
            try:
                pool, states = await seat_states(self.redis, self.pool_name, ids)
            except RedisError as exc:
                log.warning("first steps waiting for seats: Redis (%s): they think now", exc)
                pool, states = PoolSeats(queued=0, held=0, max_seats=None), {}
            now = time.monotonic()
            unseen = False
            for task_id in ids:
                waiter = self._waiting.get(task_id)
                if waiter is None or waiter.ready.done():
                    continue
                state = states.get(task_id, SeatState.UNSEEN)
                if may_think(state, pool, now - waiter.since, self.unseen_grace_s):
                    waiter.ready.set_result(None)
                else:
                    unseen = unseen or state is SeatState.UNSEEN

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
