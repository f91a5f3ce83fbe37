"""The runtime's parts on the fake engine (tests/fakes/engine.py) and the session's real
redis-server (tests/conftest.py): no Docker, no NATS server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.fakes.runtime import FakeRuntime, RuntimeHarness, unit_settings


@pytest.fixture
async def fake_runtime(redis_url: str) -> AsyncIterator[FakeRuntime]:
    """Makes a runtime (settings overridden as asked) of a pool of its own; each is stopped
    at the end of the test."""
    made: list[RuntimeHarness] = []

    def make(**overrides: Any) -> RuntimeHarness:
        harness = RuntimeHarness(unit_settings(redis_url, **overrides))
        made.append(harness)
        return harness

    yield make
    for harness in reversed(made):
        await harness.close()
