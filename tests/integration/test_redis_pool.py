"""The services' Redis client waits for a free connection instead of failing when every one
is busy (redis-py's default pool refuses at once: "Too many connections")."""

from __future__ import annotations

import asyncio

from shared.redis_client import connect_redis
from shared.settings import CommonSettings


async def test_more_commands_than_connections_wait_their_turn(redis_url: str) -> None:
    settings = CommonSettings(redis_url=redis_url, redis_max_connections=2)
    redis = connect_redis(redis_url, settings)
    try:
        # Each BLPOP holds its connection for a moment: 12 at once share the 2 connections.
        found = await asyncio.gather(
            *(redis.blpop([f"test-pool-{i}"], timeout=0.1) for i in range(12))
        )
        assert found == [None] * 12
        assert (
            len(redis.connection_pool._available_connections)
            + len(redis.connection_pool._in_use_connections)
            <= 2
        )
    finally:
        await redis.aclose()
