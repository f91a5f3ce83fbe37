"""How many idle sandboxes the warm pool keeps: `pool_min_idle`, plus what the recent
acquisition rate will consume during one cold start, plus the acquisitions waiting now and the
tasks queued for a seat, capped by `pool_max_idle` and by `pool_max_total` for everything the
replica holds (pool.py)."""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from .settings import RuntimeSettings

__all__ = ["idle_target", "refills_due"]


def idle_target(
    settings: RuntimeSettings,
    acquired_at: deque[float],
    cold_starts: deque[float],
    *,
    waiting: int,
    queued: int,
    busy: int,
) -> int:
    """Idle sandboxes to keep: the floor, plus the demand expected during one cold start.
    `acquired_at`: when sandboxes were handed out (those before the window are dropped);
    `cold_starts`: how long the latest starts took; `waiting`: acquisitions waiting now;
    `queued`: tasks waiting for a seat; `busy`: sandboxes handed out."""
    s = settings
    now = time.monotonic()
    while acquired_at and now - acquired_at[0] > s.pool_scale_window_s:
        acquired_at.popleft()
    rate = len(acquired_at) / s.pool_scale_window_s
    lead_s = statistics.median(cold_starts) if cold_starts else 1.0
    # Twice the expected demand over the time it takes to start a replacement.
    expected = math.ceil(rate * lead_s * 2) if rate else 0
    target = min(s.pool_max_idle, s.pool_min_idle + expected + waiting + queued)
    return max(0, min(target, s.pool_max_total - busy))


def refills_due(
    settings: RuntimeSettings, target: int, idle: int, refilling: int, total: int
) -> int:
    """Warm sandboxes the pool should start now: what `target` lacks beyond the `refilling`
    under way, within pool_max_total (`total`: all the replica holds or starts), at most
    pool_create_concurrency of its own at once. Its callers' starts for themselves do not
    count: counting them, a flood's starts for its tasks kept the pool from refilling at all,
    and a task arriving from another tenant found no warm sandbox left."""
    missing = min(
        target - idle - refilling,
        settings.pool_max_total - total,
        settings.pool_create_concurrency - refilling,
    )
    return max(0, missing)
