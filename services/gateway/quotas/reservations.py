"""What the counts of a tenant's quotas hold: a running task's Reservation, a tree's Holder, and the
Lua scripts that change them at once (reserve, settle, unhold); the UTC day a spend counts on."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from shared.egress_usage import utc_day
from shared.events import AgentState, utc_now
from shared.state import TaskState

__all__ = [
    "ENDED",
    "RESERVE",
    "SETTLE",
    "SPEND_KEPT_S",
    "UNHOLD",
    "Holder",
    "Reservation",
    "as_text",
    "seconds_to_next_day",
    "utc_day",
]

# A task no longer runs (for its tenant's count) in these states; a user message may resume
# FINISHED, ERROR and REJECTED ones, which are then admitted again.
ENDED = frozenset({AgentState.FINISHED, AgentState.ERROR, AgentState.STOPPED, AgentState.REJECTED})
_SETTLE_GRACE_S = 120.0
SPEND_KEPT_S = 3 * 86_400  # a day's counter outlives the day by a little, for settlements


class Reservation(BaseModel):
    """A running task's entry: the day it was admitted, the budget it reserved on that day, and
    what it had spent before (a resumed task is charged only what it spends after)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    day: str
    reserved_usd: float = Field(ge=0)
    spent_before_usd: float = Field(default=0.0, ge=0)
    at: datetime = Field(default_factory=utc_now)
    state_version: int = Field(
        default=0, ge=0, description="The State's version when admitted (0: not made yet)."
    )

    def settles(self, state: TaskState | None, now: datetime) -> bool:
        """Whether the task is seen to have ended since its admission. Its State is read as
        ended only once the controller has written it since (a resumed task still reads
        FINISHED until the controller takes the message), or after a grace period (the
        message was never queued, or the task was deleted)."""
        if state is not None and state.agent_state not in ENDED:
            return False
        if state is not None and state.version > self.state_version:
            return True
        return (now - self.at).total_seconds() > _SETTLE_GRACE_S


class Holder(BaseModel):
    """A task tree that may hold sandboxes: when its root was admitted (again), and the root's
    State version then."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: datetime = Field(default_factory=utc_now)
    state_version: int = Field(default=0, ge=0)

    def done(self, root: TaskState | None, tree_ended: bool, now: datetime) -> bool:
        """Whether a tree that holds no seat now never will again short of a new admission:
        every task of it has ended since the root was admitted (or its State is gone, after a
        grace period)."""
        if root is not None:
            return tree_ended and root.version > self.state_version
        return (now - self.at).total_seconds() > _SETTLE_GRACE_S


# KEYS: running, spend counter of today, holders. ARGV: task, reservation json, max running,
# reserved usd, spend limit ('' when none), spend ttl, holder json.
# Returns {'ok'} or {limit name, current}.
RESERVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {'ok'} end
local running = redis.call('HLEN', KEYS[1])
if running >= tonumber(ARGV[3]) then return {'max_running_tasks', tostring(running)} end
local spent = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[5] ~= '' and spent + tonumber(ARGV[4]) > tonumber(ARGV[5]) + 1e-9 then
  return {'max_spend_usd_per_day', tostring(spent)}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[7])
redis.call('INCRBYFLOAT', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return {'ok'}
"""

# KEYS: running, spend counter of the reservation's day. ARGV: task, reservation json as read,
# charge (what it spent less what it reserved), spend ttl. Only the settler that removes the
# very entry it read charges the day, so two gateways never settle one task twice.
SETTLE = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('INCRBYFLOAT', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return 1
"""

# KEYS: holders. ARGV: task, holder json as read. Only the entry read is removed, so a tree
# admitted again meanwhile (a user message resumed it) stays.
UNHOLD = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HDEL', KEYS[1], ARGV[1])
"""


def seconds_to_next_day(now: datetime) -> int:
    tomorrow = (now.astimezone(UTC) + timedelta(days=1)).replace(
        hour=0, minute=0, second=0, microsecond=0
    )
    return max(1, math.ceil((tomorrow - now).total_seconds()))


def as_text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
