"""The one way services connect to Redis: every command has a deadline."""

from __future__ import annotations

from redis.asyncio import Redis

__all__ = ["REDIS_COMMAND_TIMEOUT_S", "connect_redis"]

# No command of ours takes long (small keys, short Lua scripts): one that has not answered in
# this time is a stuck connection, and raising lets the caller retry (or redeliver) instead of
# waiting for ever.
REDIS_COMMAND_TIMEOUT_S = 10.0


def connect_redis(url: str) -> Redis:
    return Redis.from_url(
        url,
        socket_timeout=REDIS_COMMAND_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
    )
