"""Sandbox seats: how many tasks hold a sandbox, across every runtime replica and restart, and
who gets the next free one.

A task needs a seat before its first action gets a sandbox, and keeps it until the task ends
(its sandbox is released). When every seat is taken, the task's order waits in Redis and holds
nothing else: no worker, no connection, no timer. When a seat frees, it goes to the tenant
furthest below its share, weighted fair queuing on seats held:

- each tenant with queued tasks is ranked by (seats it holds + 1) / its weight, the seat it
  would hold next divided by its share; the lowest takes the seat (ties: whose head task came
  first). A tenant alone takes every seat; a quiet tenant's share goes to those who wait.
- within a tenant, interactive tasks go first, then batch ones, each first come first served.

Seats are given at the pace sandboxes start (`max_starting`, 0 for no such limit): a task seated
but whose sandbox has not started yet is *starting*, and while `max_starting` tasks are, the
next waits in the queue even if seats are free. The engine starts a few sandboxes at once as
fast as many (and many at once all finish late), so this costs a burst nothing. A *kind* (a
tenant's interactive tasks, or its batch ones) with no sandbox starting still takes a free seat
past that pace (a start slot of its own): a tenant that comes during another's flood, and an
interactive task during its own tenant's batch, wait for no start of the flood. A starting
entry older than `start_stale_s` (its replica died mid-start) stops counting.

A task seated while one of its kind still starts (the rest of a burst), or in arrival order
while younger ones still queue (the head of a backlog), is marked `leaves_warm`: its sandbox
is started for it rather than taken from the pool's last warm ones, which stay for whoever
comes next (another tenant's task, an interactive one), so that it starts at once instead of
waiting for a start among the burst's. A burst's first task takes a warm one; the pool starts
more for the rest while their first LLM call runs.

Weights are the operator's (per tenant, `seat_weight` in the tenant's limits, 1 by default),
kept by the gateway in `deckhands:seat-weights` (HASH tenant -> weight); the scripts only read
them.

Each decision is one Lua script, so two replicas never give away the same seat: the scripts, and
the keys they keep per pool, are shared/seat_scripts.py.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from redis.asyncio import Redis

from .seat_scripts import BATCH_OFFSET, SeatScripts, seats_prefix

__all__ = [
    "NO_TENANT",
    "WEIGHTS_KEY",
    "Admission",
    "QueuePlace",
    "SandboxSeats",
    "SeatRecord",
    "Seating",
    "queue_place",
    "queue_position",
    "seats_prefix",
]

# The weights of tenants (HASH tenant -> weight), written by the gateway for every pool.
WEIGHTS_KEY = "deckhands:seat-weights"
ANNOUNCED_FOR_S = 30
# The tenant of a task made before tasks named theirs (an order of an older controller).
NO_TENANT = "-"
_RELEASES_KEPT = 100
_RATE_WINDOW_S = 600.0


@dataclass(frozen=True)
class SeatRecord:
    """A task's seat, as its sandbox's start goes by it: its tenant (None: no record), whether
    it was seated as a batch task, and whether it leaves the pool's last warm sandboxes to
    whoever comes next (seated while one of its kind still started, or in arrival order ahead
    of a backlog)."""

    tenant: str | None
    batch: bool
    leaves_warm: bool


@dataclass(frozen=True)
class Seating:
    """A task given a seat from the queue: whose, and how long it waited (for the metrics)."""

    task_id: str
    tenant_id: str
    waited_s: float


@dataclass(frozen=True)
class Admission:
    seated: bool
    position: int  # 1-based place in the queue; 0 when seated
    seatings: tuple[Seating, ...] = ()  # every task seated by this admission, this one too


@dataclass(frozen=True)
class QueuePlace:
    """Where a queued task stands: `position` is 1 + the tasks to be seated before it if every
    tenant kept the seats it holds (a seat its own tenant frees moves it up sooner), and
    `estimate_s` is that many seats at the rate seats freed lately (None: none freed lately)."""

    position: int
    estimate_s: float | None


class SandboxSeats:
    def __init__(
        self,
        redis: Redis,
        pool_name: str,
        max_seats: int,
        max_starting: int = 0,
        start_stale_s: float = 120.0,
    ) -> None:
        self.redis = redis
        self.pool_name = pool_name
        self.max_seats = max_seats
        self.max_starting = max_starting
        self.start_stale_s = start_stale_s
        self.prefix = seats_prefix(pool_name)
        self.seats_key = f"{self.prefix}:seats"
        self.queue_key = f"{self.prefix}:queue"
        self._scripts = SeatScripts(redis, pool_name)

    async def admit(
        self,
        task_id: str,
        order_json: str = "",
        *,
        tenant_id: str | None = None,
        batch: bool = False,
        weak: bool = False,
    ) -> Admission:
        """Seat the task if a seat is free and the fair order puts it first; otherwise queue it
        (keeping `order_json` to send again once it is seated; a `weak` one, a PrepareSandbox,
        never replaces an order kept already, and is forgotten when the task is seated now).
        Seats freed meanwhile go to whoever the fair order names: their orders are sent again by
        the next `pump`."""
        outcome, seated = await self._scripts.admit(
            keys=[],
            args=[
                self.prefix,
                WEIGHTS_KEY,
                task_id,
                tenant_id or NO_TENANT,
                repr(time.time()),
                self.max_seats,
                order_json,
                1 if batch else 0,
                BATCH_OFFSET,
                *self._start_limits(),
                1 if weak else 0,
            ],
        )
        seatings = tuple(_seating(entry) for entry in seated)
        if _text(outcome) == "seated":
            return Admission(seated=True, position=0, seatings=seatings)
        place = await queue_place(self.redis, self.pool_name, task_id)
        return Admission(seated=False, position=place.position if place else 1, seatings=seatings)

    async def pump(self, resend_after_s: float = 10.0) -> tuple[list[str], list[Seating]]:
        """Seat queued tasks while seats are free: the orders to send again (oldest first) and
        the tasks seated now."""
        orders, seated = await self._scripts.pump(
            keys=[],
            args=[
                self.prefix,
                WEIGHTS_KEY,
                repr(time.time()),
                self.max_seats,
                resend_after_s,
                *self._start_limits(),
            ],
        )
        return [_text(o) for o in orders], [_seating(entry) for entry in seated]

    def _start_limits(self) -> tuple[int, str]:
        return self.max_starting, repr(time.time() - self.start_stale_s)

    async def started(self, task_id: str) -> bool:
        """The task's sandbox started (or failed to): it no longer counts as starting. True when
        it did, so a start slot is free for the next queued task (`pump`)."""
        return bool(await self.redis.zrem(f"{self.prefix}:starting", task_id))

    async def announce(self) -> None:
        """Say that the pool has a runtime, and how many seats (shared/seat_states.py): for
        `ANNOUNCED_FOR_S`, said again every second while a replica runs."""
        await self.redis.set(f"{self.prefix}:max_seats", self.max_seats, ex=ANNOUNCED_FOR_S)

    async def seat_of(self, task_id: str) -> SeatRecord:
        """What the task's seat says of its sandbox's start, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(f"{self.prefix}:owner", task_id)
        pipe.sismember(f"{self.prefix}:batch", task_id)
        pipe.sismember(f"{self.prefix}:leaves_warm", task_id)
        owner, batch, leaves = await pipe.execute()
        return SeatRecord(_text(owner) if owner is not None else None, bool(batch), bool(leaves))

    async def starting(self) -> int:
        """Tasks seated whose sandbox has not started yet."""
        return int(await self.redis.zcard(f"{self.prefix}:starting"))

    async def census(self) -> tuple[int, int, int]:
        """(seats taken, tasks queued, seated tasks whose sandbox is still starting)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.seats_key)
        pipe.zcard(self.queue_key)
        pipe.zcard(f"{self.prefix}:starting")
        taken, queued, starting = await pipe.execute()
        return int(taken), int(queued), int(starting)

    async def handled(self, task_id: str) -> None:
        """The task's waiting order reached a runtime after it was seated: forget it."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hdel(f"{self.prefix}:orders", task_id)
        pipe.zrem(f"{self.prefix}:admitted", task_id)
        await pipe.execute()

    async def handled_order(self, task_id: str, order_json: str) -> None:
        """`order_json`, if it is the order kept for the task, reached a runtime that had
        nothing to do with it (a preparation whose sandbox runs already): forget it, or the
        pump sends it again every resend_after_s for as long as the task runs. Another order
        kept (an action's) stays."""
        await self._scripts.forget_order(keys=[], args=[self.prefix, task_id, order_json])

    async def hold(self, task_id: str, tenant_id: str | None = None) -> None:
        """Count a task that holds a sandbox already (adopted after a restart), max or not."""
        await self._scripts.hold(
            keys=[], args=[self.prefix, task_id, tenant_id or NO_TENANT, repr(time.time())]
        )

    async def release(self, task_id: str) -> bool:
        """The task no longer holds a sandbox (or no longer wants one): free its seat."""
        held = await self._scripts.release(
            keys=[], args=[self.prefix, task_id, repr(time.time()), _RELEASES_KEPT]
        )
        return bool(held)

    async def seated(self) -> dict[str, float]:
        raw = await self.redis.hgetall(self.seats_key)
        return {_text(k): float(_text(v)) for k, v in raw.items()}

    async def counts(self) -> tuple[int, int]:
        """(seats taken, tasks queued)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hlen(self.seats_key)
        pipe.zcard(self.queue_key)
        taken, queued = await pipe.execute()
        return int(taken), int(queued)

    async def tenants(self) -> dict[str, tuple[int, int]]:
        """Per tenant: (seats held, tasks queued)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(f"{self.prefix}:held")
        pipe.hgetall(f"{self.prefix}:waiting")
        held, waiting = await pipe.execute()
        out: dict[str, tuple[int, int]] = {}
        for tenant, count in held.items():
            out[_text(tenant)] = (int(count), 0)
        for tenant, count in waiting.items():
            seats, _ = out.get(_text(tenant), (0, 0))
            out[_text(tenant)] = (seats, int(count))
        return out

    async def position(self, task_id: str) -> int | None:
        """The task's 1-based place in the fair order, or None when it is not waiting."""
        place = await queue_place(self.redis, self.pool_name, task_id)
        return None if place is None else place.position


async def queue_place(redis: Redis, pool_name: str, task_id: str) -> QueuePlace | None:
    """Where a queued task stands in its pool's fair order (None when it is not waiting).

    Seats go, one by one, to the tenant whose next seat is lowest in (held + 1) / weight; so
    the k-th queued task of a tenant holding h seats has key (h + k) / w, and the tasks ahead of
    one are those with a lower key (or the same key and an earlier head)."""
    prefix = seats_prefix(pool_name)
    pipe = redis.pipeline(transaction=False)
    pipe.hget(f"{prefix}:owner", task_id)
    pipe.zscore(f"{prefix}:queue", task_id)
    pipe.hgetall(f"{prefix}:waiting")
    pipe.hgetall(f"{prefix}:held")
    pipe.hgetall(WEIGHTS_KEY)
    pipe.lrange(f"{prefix}:released", 0, -1)
    owner, ticket, waiting_raw, held_raw, weights_raw, released = await pipe.execute()
    if owner is None or ticket is None:
        return None
    own = _text(owner)
    rank = await redis.zrank(f"{prefix}:q:{own}", task_id)
    if not isinstance(rank, int):
        return None
    waiting = {_text(t): int(n) for t, n in waiting_raw.items()}
    held = {_text(t): int(n) for t, n in held_raw.items()}
    weights = {_text(t): _weight(w) for t, w in weights_raw.items()}

    def key(tenant: str, k: int) -> float:
        return (held.get(tenant, 0) + k) / weights.get(tenant, 1.0)

    mine = key(own, rank + 1)
    ahead = rank
    for tenant, queued in waiting.items():
        if tenant == own or queued <= 0:
            continue
        # Its k-th task comes first when (held + k) / w < mine, i.e. k < x; at k == x (a tie)
        # the earlier ticket does.
        x = mine * weights.get(tenant, 1.0) - held.get(tenant, 0)
        tied = round(x)
        if abs(x - tied) < 1e-9:
            ahead += max(0, min(queued, tied - 1))
            if 1 <= tied <= queued and await _ticket_of(redis, prefix, tenant, tied) < float(
                ticket
            ):
                ahead += 1
        else:
            ahead += max(0, min(queued, math.ceil(x) - 1))
    position = ahead + 1
    return QueuePlace(position=position, estimate_s=_estimate(position, released))


async def queue_position(redis: Redis, pool_name: str, task_id: str) -> int | None:
    """A task's 1-based place in its pool's fair order for a seat, or None when not waiting."""
    place = await queue_place(redis, pool_name, task_id)
    return None if place is None else place.position


async def _ticket_of(redis: Redis, prefix: str, tenant: str, k: int) -> float:
    """The arrival ticket of the tenant's k-th queued task (infinity: gone meanwhile)."""
    tasks = await redis.zrange(f"{prefix}:q:{tenant}", k - 1, k - 1)
    head = tasks[0] if tasks else None
    score = await redis.zscore(f"{prefix}:queue", head) if isinstance(head, bytes | str) else None
    return math.inf if score is None else float(score)


def _estimate(position: int, released: list[bytes | str]) -> float | None:
    """Seconds until `position` seats have freed, at the rate of the recent releases."""
    now = time.time()
    times = [t for t in (float(_text(r)) for r in released) if now - t <= _RATE_WINDOW_S]
    if len(times) < 2:
        return None
    span = max(times) - min(times)
    if span <= 0:
        return None
    rate = (len(times) - 1) / span
    return round(position / rate, 1)


def _seating(entry: list[bytes | str]) -> Seating:
    task, tenant, waited = (_text(part) for part in entry)
    return Seating(task_id=task, tenant_id=tenant, waited_s=max(0.0, float(waited)))


def _weight(raw: bytes | str) -> float:
    try:
        weight = float(_text(raw))
    except ValueError:
        return 1.0
    return weight if weight > 0 else 1.0


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
