"""An LLM's capacity shared through a real Redis by two reasoner replicas (two gates, two
connections): limits never passed together, room granted by the tenants' weights, a provider's
429 pausing the model for both, and a fallback model asked while the first is paused or down,
through litellm against scripted servers in processes of their own."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.asyncio import Redis

from services.reasoner.capacity import CapacityGate, CapacityWait
from services.reasoner.llm import LLMClient
from services.reasoner.settings import ModelLimits, ReasonerSettings
from shared.admission import WEIGHTS_KEY
from shared.events import TaskPriority
from tools.procs import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[3]
MESSAGES = [{"role": "system", "content": "x"}, {"role": "user", "content": "capacity test"}]


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def model_name() -> str:
    return f"openai/capacity-{uuid.uuid4().hex[:8]}"


@contextmanager
def scripted_server(
    tmp_path: Path, turns: list[dict[str, Any]], limits: dict[str, Any] | None = None
) -> Iterator[str]:
    """The scripted OpenAI-compatible server with one conversation (and, given `limits`, a
    provider's limits it enforces); yields its base URL."""
    script = tmp_path / f"script-{uuid.uuid4().hex[:6]}.json"
    body: dict[str, Any] = {"model": "scripted", "turns": turns}
    if limits:
        body["limits"] = limits
    script.write_text(json.dumps(body))
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.scripted_llm", "--script", str(script), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        proc.terminate()
        proc.wait(10)


def stats(base: str) -> dict[str, Any]:
    return dict(httpx.get(base.removesuffix("/v1") + "/stats", timeout=5).json())


async def test_two_replicas_never_pass_the_concurrency_limit_together(
    redis_url: str, redis: Redis
) -> None:
    model = model_name()
    limits = ModelLimits(max_concurrent=3)
    other = Redis.from_url(redis_url)
    gates = [CapacityGate(redis, model, limits, 30), CapacityGate(other, model, limits, 30)]
    running = most = 0

    async def call(i: int) -> None:
        nonlocal running, most
        async with gates[i % 2].lease("t", 0):
            running += 1
            most = max(most, running)
            await asyncio.sleep(0.05)
            running -= 1

    try:
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(call(i) for i in range(24))), 30)
    finally:
        await other.aclose()
    assert most == 3
    assert time.monotonic() - started >= 24 / 3 * 0.05 * 0.9  # it did wait


async def test_requests_per_minute_hold_and_say_why(redis: Redis) -> None:
    gate = CapacityGate(redis, model_name(), ModelLimits(requests_per_minute=4), 30)
    for _ in range(4):
        async with gate.lease("t", 0):
            pass
    told: list[CapacityWait] = []

    async def notice(wait: CapacityWait) -> None:
        told.append(wait)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            async with gate.lease("t", 0, notice, notice_after_s=0):
                pass
    assert told and told[0].why == "requests per minute" and 55 < told[0].wait_s <= 60


async def test_tokens_per_minute_count_what_calls_really_used(redis: Redis) -> None:
    gate = CapacityGate(redis, model_name(), ModelLimits(tokens_per_minute=1000), 30)
    async with gate.lease("t", 900) as lease:
        lease.used_tokens = 100  # the provider counted less than estimated
    async with asyncio.timeout(1):
        async with gate.lease("t", 800):
            pass  # 100 + 800 fit
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            async with gate.lease("t", 200):
                pass  # 900 + 200 do not


async def test_room_goes_to_tenants_by_their_weights(redis: Redis) -> None:
    model = model_name()
    await redis.hset(WEIGHTS_KEY, "cap-heavy", 3)
    gate = CapacityGate(redis, model, ModelLimits(max_concurrent=1), 30)
    order: list[str] = []

    async def call(tenant: str) -> None:
        async with gate.lease(tenant, 0):
            order.append(tenant)
            await asyncio.sleep(0.02)

    try:
        await asyncio.wait_for(
            asyncio.gather(
                *(call("cap-light") for _ in range(12)), *(call("cap-heavy") for _ in range(12))
            ),
            30,
        )
    finally:
        await redis.hdel(WEIGHTS_KEY, "cap-heavy")
    # While both wait (the first 16 grants), the heavy tenant gets about three in four.
    heavy = order[:16].count("cap-heavy")
    assert 10 <= heavy <= 13, order


async def test_a_tenants_interactive_calls_go_ahead_of_its_batch(redis: Redis) -> None:
    gate = CapacityGate(redis, model_name(), ModelLimits(max_concurrent=1), 30)
    order: list[str] = []
    holding = asyncio.Event()
    go = asyncio.Event()

    async def first() -> None:
        async with gate.lease("t", 0, priority=TaskPriority.BATCH):
            holding.set()
            await go.wait()

    async def call(name: str, priority: TaskPriority) -> None:
        async with gate.lease("t", 0, priority=priority):
            order.append(name)
            await asyncio.sleep(0.01)

    holder = asyncio.create_task(first())
    await holding.wait()
    batch = [asyncio.create_task(call(f"b{i}", TaskPriority.BATCH)) for i in range(4)]
    await asyncio.sleep(0.2)  # the batch calls wait first
    urgent = [asyncio.create_task(call(f"i{i}", TaskPriority.INTERACTIVE)) for i in range(2)]
    await asyncio.sleep(0.05)
    go.set()
    await asyncio.wait_for(asyncio.gather(holder, *batch, *urgent), 30)
    assert order[:2] == ["i0", "i1"] and sorted(order[2:]) == ["b0", "b1", "b2", "b3"], order


async def test_a_pause_holds_every_replica(redis_url: str, redis: Redis) -> None:
    model = model_name()
    other = Redis.from_url(redis_url)
    try:
        first, second = CapacityGate(redis, model, None, 30), CapacityGate(other, model, None, 30)
        await first.pause(0.6)
        assert 0.3 < await second.paused_for() <= 0.6
        started = time.monotonic()
        async with second.lease("t", 0):
            pass
        assert time.monotonic() - started >= 0.5
        await first.pause(0.1)  # a shorter pause does not shorten a longer one
        await second.pause(0.0)
    finally:
        await other.aclose()


def settings(model: str, base: str, **extra: Any) -> ReasonerSettings:
    return ReasonerSettings(
        llm_model=model,
        llm_api_base=base,
        llm_retry_backoff_s=0.2,
        llm_num_retries=1,
        llm_native_tool_calling="true",
        **extra,
    )


async def test_a_providers_429_pauses_the_model_for_the_other_replica(
    tmp_path: Path, redis: Redis
) -> None:
    turns = [{"content": "hello", "fail_first": {"status": 429, "times": 1, "retry_after": 1.0}}]
    with scripted_server(tmp_path, turns) as base:
        model = model_name()
        first, second = LLMClient(settings(model, base)), LLMClient(settings(model, base))
        first.attach(redis)
        second.attach(redis)
        notices: list[str] = []

        async def notice(attempt: int, wait_s: float, why: str) -> None:
            notices.append(why)

        started = time.monotonic()
        reply = await first.complete(MESSAGES, native=True, on_rate_limit=notice)
        assert reply.content == "hello" and time.monotonic() - started >= 0.9
        assert notices[0] == f"LLM rate limit ({model})"
        # The other replica calls during the pause: it waits for its end, without a 429.
        await first._gates[model].pause(0.8)
        started = time.monotonic()
        await second.complete(MESSAGES, native=True)
        assert time.monotonic() - started >= 0.7
        assert stats(base)["requests"] == 3  # the 429, then one answer each: no second 429


async def test_a_fallback_is_asked_while_the_first_model_is_paused_or_down(
    tmp_path: Path, redis: Redis
) -> None:
    limited = [
        {"content": "never", "fail_first": {"status": 429, "times": 1000, "retry_after": 30}}
    ]
    with (
        scripted_server(tmp_path, limited) as busy,
        scripted_server(tmp_path, [{"content": "from the fallback"}]) as spare,
    ):
        model, fallback = model_name(), model_name()
        client = LLMClient(
            settings(
                model,
                busy,
                llm_fallback_models=[{"model": fallback, "api_base": spare}],
            )
        )
        client.attach(redis)
        started = time.monotonic()
        reply = await client.complete(MESSAGES, native=True)
        assert reply.content == "from the fallback" and reply.usage.model == fallback
        assert time.monotonic() - started < 5  # not the 30 s pause
        assert await client._gates[model].paused_for() > 20
        # Paused: the next call goes straight to the fallback.
        await client.complete(MESSAGES, native=True)
        assert stats(spare)["requests"] == 2

        # Down (nothing listens): after its retries, the fallback answers.
        down = LLMClient(
            settings(
                model_name(),
                f"http://127.0.0.1:{free_port()}/v1",
                llm_fallback_models=[{"model": fallback, "api_base": spare}],
            )
        )
        down.attach(redis)
        assert (await down.complete(MESSAGES, native=True)).content == "from the fallback"


def limited_server(tmp_path: Path, limits: dict[str, Any], delay_s: float) -> Any:
    """A scripted server enforcing provider limits (429 with Retry-After past them)."""
    return scripted_server(tmp_path, [{"content": "ok", "delay_s": delay_s}], limits)


async def test_two_replicas_keep_within_a_providers_limits(tmp_path: Path, redis: Redis) -> None:
    limits = {"max_concurrent": 3, "requests_per_minute": 40}
    with limited_server(tmp_path, limits, delay_s=0.1) as base:
        model = model_name()
        capacity = {model: {"max_concurrent": 3, "requests_per_minute": 40}}
        replicas = [LLMClient(settings(model, base, llm_capacity=capacity)) for _ in range(2)]
        for replica in replicas:
            replica.attach(redis)
        replies = await asyncio.wait_for(
            asyncio.gather(
                *(replicas[i % 2].complete(MESSAGES, native=True, tenant_id="t") for i in range(30))
            ),
            60,
        )
        assert all(r.content == "ok" for r in replies)
        seen = stats(base)
        assert seen["refused_429"] == 0 and seen["requests"] == 30
        assert seen["max_concurrent_seen"] <= 3 and seen["max_requests_in_60s"] <= 40


async def test_without_limits_set_the_providers_429s_pause_the_model_and_every_call_ends(
    tmp_path: Path, redis: Redis
) -> None:
    limits = {"max_concurrent": 2, "retry_after_s": 0.3}
    with limited_server(tmp_path, limits, delay_s=0.2) as base:
        model = model_name()
        replicas = [LLMClient(settings(model, base)) for _ in range(2)]
        for replica in replicas:
            replica.attach(redis)
        replies = await asyncio.wait_for(
            asyncio.gather(*(replicas[i % 2].complete(MESSAGES, native=True) for i in range(8))),
            60,
        )
        assert all(r.content == "ok" for r in replies)
        seen = stats(base)
        assert seen["requests"] == 8 and seen["max_concurrent_seen"] <= 2
        # The 429s paused the model for both replicas rather than each call retrying at once:
        # far fewer refusals than calls retrying on their own would get.
        assert 1 <= seen["refused_429"] <= 8, seen
