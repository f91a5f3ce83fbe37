"""Issue 15: a message of max_payload - 100 bytes on every subject a service consumes, published
raw to the real stream while the whole system runs (every service a process, real NATS, Redis
and Docker). Each is dead-lettered once, the service stays connected (its /readyz), a restart
of the service is not wedged by it (nothing is redelivered), and a normal task still finishes.

Two shapes per subject: bytes that are no JSON at all, and a JSON object whose ids fill the
message (what the dead-letter path reads to tell the task's controller)."""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient

from shared.subjects import (
    DLQ_STREAM,
    EVENTS_STREAM,
    WORK_STREAM,
    Service,
    dlq_subject,
    event_subject,
    work_subject,
)
from tools.run_task import run_task
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(420)]

# Every subject a service consumes, with its stream and the service that consumes it.
CONSUMED = [
    (Service.CONTROLLER, WORK_STREAM),
    (Service.REASONER, WORK_STREAM),
    (Service.SECURITY, WORK_STREAM),
    (Service.RUNTIME, WORK_STREAM),
    (Service.STORAGE, EVENTS_STREAM),
]


def _subject(service: Service, task_id: str) -> str:
    if service is Service.STORAGE:
        return event_subject(task_id)
    return work_subject(service, task_id)


def _poison(shape: str, size: int, task_id: str) -> bytes:
    """A message body of exactly `size` bytes."""
    if shape == "garbage":
        pattern = b"\xff\x00not json "
        return (pattern * (size // len(pattern) + 1))[:size]
    # A JSON object with every id the dead-letter path looks at, all enormous.
    skeleton = {"kind": "run", "task_id": task_id, "id": "", "cause": "", "action": {"id": ""}}
    fill = (size - len(json.dumps(skeleton))) // 3
    body = {**skeleton, "id": "i" * fill, "cause": "c" * fill, "action": {"id": "a" * fill}}
    data = json.dumps(body).encode()
    return data + b" " * (size - len(data))


@pytest.mark.parametrize("shape", ["garbage", "huge-ids"])
def test_the_poison_is_exactly_the_size_asked_for(shape: str) -> None:
    assert len(_poison(shape, 1_048_476, "t")) == 1_048_476


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("poison")),
        extra_env={"DECKHANDS_POOL_MIN_IDLE": "1", "DECKHANDS_ACK_WAIT_S": "5"},
    )
    with running(config) as stack:
        yield stack


def _ready(stack: Stack, service: Service) -> tuple[int, str]:
    try:
        answer = httpx.get(f"{stack.config.health_url(service.value)}/readyz", timeout=5)
    except httpx.HTTPError as exc:
        return 0, str(exc)
    return answer.status_code, answer.text


async def _dead_letters(nc: NatsClient, service: Service) -> list[dict[str, Any]]:
    """Headers of every dead letter of `service`, read without consuming them."""
    js = nc.jetstream()
    sub = await js.subscribe(dlq_subject(service), stream=DLQ_STREAM, ordered_consumer=True)
    found = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                break
            found.append({**(msg.headers or {}), "_size": len(msg.data)})
    finally:
        await sub.unsubscribe()
    return found


async def _wait_for_dead_letters(
    nc: NatsClient, service: Service, stream_seqs: set[str], timeout_s: float = 60
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        ours = [
            h
            for h in await _dead_letters(nc, service)
            if h.get("Deckhands-Dlq-Stream-Seq") in stream_seqs
        ]
        if {h["Deckhands-Dlq-Stream-Seq"] for h in ours} == stream_seqs:
            return ours
        assert time.monotonic() < deadline, f"{service}: dead letters so far {ours}"
        await asyncio.sleep(0.5)


async def test_a_message_near_max_payload_on_every_subject_is_dead_lettered_once(
    stack: Stack,
) -> None:
    nc = await nats.connect(**stack.nats_login())
    try:
        js = nc.jetstream()
        size = nc.max_payload - 100
        published: dict[Service, set[str]] = {}
        pids = stack.running()
        for service, stream in CONSUMED:
            seqs = set()
            for shape in ("garbage", "huge-ids"):
                task_id = f"poison-{service.value}-{shape}"
                ack = await js.publish(
                    _subject(service, task_id), _poison(shape, size, task_id), stream=stream
                )
                seqs.add(str(ack.seq))
            published[service] = seqs

        for service, _ in CONSUMED:
            ours = await _wait_for_dead_letters(nc, service, published[service])
            assert len(ours) == 2, f"{service}: dead-lettered more than once: {ours}"
            for headers in ours:
                assert headers["Deckhands-Dlq-Deliveries"] == "1", headers
                assert int(headers["Deckhands-Dlq-Truncated-From"]) == size, (service, headers)
                assert headers["_size"] <= 256 * 1024
            assert _ready(stack, service)[0] == 200, (service, _ready(stack, service))
        # Nobody was cut off from NATS and exited (status 70) on the way.
        assert stack.running() == pids

        # A restart of each service finds nothing of them left to take (nothing redelivered).
        for service, _ in CONSUMED:
            stack.kill_service(service.value)
            stack.start_service(service.value)
            stack.wait_ready((service.value,))
        await asyncio.sleep(3)
        for service, _ in CONSUMED:
            assert _ready(stack, service)[0] == 200, (service, _ready(stack, service))
            again = [
                h
                for h in await _dead_letters(nc, service)
                if h.get("Deckhands-Dlq-Stream-Seq") in published[service]
            ]
            assert len(again) == 2, f"{service}: dead-lettered again after a restart: {again}"
        work = await js.stream_info(WORK_STREAM)
        assert work.state.messages == 0, "a poison message is still queued"
    finally:
        await nc.close()

    # And the system still does its work.
    seed = "Write a Python script that prints the squares of 1 to 10 and run it"
    result = await asyncio.to_thread(
        partial(run_task, api_key=stack.api_key),
        stack.config.gateway_url,
        seed,
        120,
        io.StringIO(),
    )
    assert result["state"] == "FINISHED", result
