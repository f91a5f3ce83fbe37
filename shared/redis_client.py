"""The one way services connect to Redis: every command has a deadline."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from .settings import CommonSettings

__all__ = ["REDIS_COMMAND_TIMEOUT_S", "connect_redis"]

# No command of ours takes long (small keys, short Lua scripts): one that has not answered in
# this time is a stuck connection, and raising lets the caller retry (or redeliver) instead of
# waiting for ever.
REDIS_COMMAND_TIMEOUT_S = 10.0


def connect_redis(url: str, settings: CommonSettings | None = None) -> Redis:
    """A client of `url`, as the service's Redis user when `settings` name one."""
    login: dict[str, Any] = {}
    if settings is not None and settings.redis_user:
        login = {
            "username": settings.redis_user,
            "password": settings.redis_password.get_secret_value(),
        }
    return Redis.from_url(
        url,
        **login,
        socket_timeout=REDIS_COMMAND_TIMEOUT_S,
        socket_connect_timeout=5.0,
        health_check_interval=30,
    )
