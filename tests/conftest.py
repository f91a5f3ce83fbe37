"""Fixtures that start the real parts: nats-server with JetStream and redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from shared.settings import CommonSettings
from shared.streams import ensure_streams
from tools.procs import free_port, start_nats, start_redis

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

# Tests send Ctrl-C (SIGINT) to the CLI and the eval harness and expect exit code 130. A shell
# starts a background job (`bash .ci/run &`) with SIGINT ignored, every child inherits that, and
# Python then installs no KeyboardInterrupt handler: Ctrl-C would do nothing. With a handler of
# our own here, the children exec'd from this process start with the default disposition again.
signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("nats")
    port = free_port()
    proc = start_nats(port, root / "store", root / "nats.log")
    yield f"nats://127.0.0.1:{port}"
    _stop(proc)


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("redis")
    port = free_port()
    proc = start_redis(port, root / "data", root / "redis.log")
    yield f"redis://127.0.0.1:{port}/0"
    _stop(proc)


@pytest.fixture(scope="session")
def settings(nats_url: str, redis_url: str) -> CommonSettings:
    return CommonSettings(
        nats_url=nats_url,
        redis_url=redis_url,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.2,
        max_deliveries=3,
    )


@pytest.fixture(scope="session")
async def streams(settings: CommonSettings) -> CommonSettings:
    await ensure_streams(settings)
    return settings


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
async def isolated_settings(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str
) -> AsyncIterator[CommonSettings]:
    """A nats-server of the module's own, streams declared.

    Work-queue streams refuse two consumers with overlapping filters, so a test that runs a
    service's real durable consumer (e.g. `deckhands.work.reasoner.*`) next to a test that
    reads one task's work subject needs a server to itself.
    """
    root = tmp_path_factory.mktemp("nats-isolated")
    port = free_port()
    proc = start_nats(port, root / "store", root / "nats.log")
    settings = CommonSettings(
        nats_url=f"nats://127.0.0.1:{port}",
        redis_url=redis_url,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.2,
        max_deliveries=3,
    )
    await ensure_streams(settings)
    yield settings
    _stop(proc)
