"""A task's trajectory to replay (seed 002, ReplayManager), kept in Redis.

The gateway saves the trajectory a task was created with (the events of an earlier task, as
`GET /v1/tasks/{id}/trajectory` exports them: a JSON array of event objects); the reasoner
loads it on every step and answers with the next recorded agent action instead of asking the
LLM. Key: `deckhands:trajectory:<task_id>`, a JSON array.
"""

from __future__ import annotations

import json
from typing import Any

from redis.asyncio import Redis

__all__ = ["TrajectoryError", "load_trajectory", "save_trajectory", "trajectory_key"]

_PREFIX = "deckhands"


class TrajectoryError(ValueError):
    """What is stored (or given) is not a list of event objects."""


def trajectory_key(task_id: str, prefix: str = _PREFIX) -> str:
    return f"{prefix}:trajectory:{task_id}"


def _check(events: Any) -> list[dict[str, Any]]:
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise TrajectoryError("a trajectory is a JSON array of event objects")
    return events


async def save_trajectory(
    redis: Redis, task_id: str, events: list[dict[str, Any]], *, ttl_s: int | None = None
) -> None:
    """Store the trajectory `task_id` replays; save it before the task's first step."""
    await redis.set(trajectory_key(task_id), json.dumps(_check(events)), ex=ttl_s)


async def load_trajectory(redis: Redis, task_id: str) -> list[dict[str, Any]] | None:
    """The stored trajectory, or None if the task has none. TrajectoryError if it is corrupt."""
    raw = await redis.get(trajectory_key(task_id))
    if raw is None:
        return None
    try:
        return _check(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise TrajectoryError(f"the stored trajectory is not JSON: {exc}") from exc
