"""Fixtures that start the real parts: nats-server with JetStream and redis-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_timeout
from asyncio_tasks import end_leftovers, print_stacks  # type: ignore[import-not-found]
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


@pytest.fixture(scope="session", autouse=True)
async def _no_task_outlives_the_session() -> AsyncIterator[None]:
    """A test stopped by its timeout leaves its services' tasks on the shared loop; closing the
    loop waits for every task to end, and one that swallows cancellations would hang the end
    of the run (it did in CI, for the whole 600 s of the last test's timeout)."""
    yield
    left = await end_leftovers(20.0)
    if left:
        print("tasks still running at the session's end:", *left, sep="\n", file=sys.stderr)


@pytest.fixture(autouse=True)
async def _asyncio_stacks_before_the_timeout(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """pytest-timeout shows the threads' stacks, and a hung async test's thread is an idle
    event loop: what each task awaits is printed (to the test's captured stderr) shortly
    before the timeout ends the test."""
    timeout = pytest_timeout._get_item_settings(request.node).timeout
    loop = asyncio.get_running_loop()
    handle = None
    if timeout:
        title = f"{request.node.nodeid}, near its timeout of {timeout:.0f} s"
        handle = loop.call_later(max(timeout - 10.0, timeout * 0.8), print_stacks, title, loop)
    yield
    if handle is not None:
        handle.cancel()


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
