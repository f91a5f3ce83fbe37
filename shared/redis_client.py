"""The one way services connect to Redis: every command has a deadline."""

from __future__ import annotations

from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis

from .settings import CommonSettings

__all__ = ["REDIS_COMMAND_TIMEOUT_S", "REDIS_MAX_CONNECTIONS", "connect_redis"]

# No command of ours takes long (small keys, short Lua scripts): one that has not answered in
# this time is a stuck connection, and raising lets the caller retry (or redeliver) instead of
# waiting for ever.
REDIS_COMMAND_TIMEOUT_S = 10.0
# Without settings (tools, tests): CommonSettings' default.
REDIS_MAX_CONNECTIONS = 256


def connect_redis(url: str, settings: CommonSettings | None = None) -> Redis:
    """A client of `url`, as the service's Redis user when `settings` name one."""
    login: dict[str, Any] = {}
    if settings is not None and settings.redis_user:
        login = {
            "username": settings.redis_user,
            "password": settings.redis_password.get_secret_value(),
        }
    # A pool that waits for a free connection (up to the command deadline) instead of
    # redis-py's default, which fails at once past 100 connections in use: 200 tasks posted
    # at once had the gateway answer 503 "Too many connections" to most of them.
    pool = BlockingConnectionPool.from_url(
        url,
        **login,
        max_connections=(
            settings.redis_max_connections if settings is not None else REDIS_MAX_CONNECTIONS
        ),
        timeout=REDIS_COMMAND_TIMEOUT_S,
        socket_timeout=REDIS_COMMAND_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
    )
    return Redis.from_pool(pool)
