"""A controller's broker on the session's real nats-server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from shared.broker import ServiceBroker, build_broker
from shared.settings import CommonSettings
from shared.subjects import Service


@pytest.fixture
async def broker(isolated_settings: CommonSettings) -> AsyncIterator[ServiceBroker]:
    broker = build_broker(isolated_settings, Service.CONTROLLER)
    await broker.connect()
    try:
        yield broker
    finally:
        await broker.stop()
