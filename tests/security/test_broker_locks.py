"""NATS and Redis only serve deckhands' own users, each within its own rights: the broker refuses
a client without credentials, and a service's credentials used for what that service never
does (an ExecuteAction sent by the reasoner, a verdict or a review order forged by another
service, a stream deleted by a service); Redis refuses a client without a password and a
service's user running FLUSHALL. Each case checks that the message never reached its stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest
import redis
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from shared.commands import ExecuteAction
from shared.events import (
    CmdRunAction,
    EventSource,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.subjects import EVENTS_STREAM, ROUTED_STREAM, WORK_STREAM
from tools.stack import Stack

TASK = "lockedtask0"


async def _client(stack: Stack, user: str, errors: list[str]) -> Client:
    async def record(exc: Exception) -> None:
        errors.append(str(exc).lower())

    return await nats.connect(
        **stack.nats_login(user), error_cb=record, allow_reconnect=False, connect_timeout=5
    )


@pytest.fixture
async def admin(stack: Stack) -> AsyncIterator[Client]:
    client = await _client(stack, "admin", [])
    yield client
    await client.close()


async def _refused_publish(
    stack: Stack, admin: Client, user: str, subject: str, body: bytes, stream: str = WORK_STREAM
) -> list[str]:
    """Publish as `user`; the server's errors. The subject must hold nothing afterwards."""
    errors: list[str] = []
    client = await _client(stack, user, errors)
    try:
        await client.publish(subject, body, headers={"Nats-Msg-Id": f"forged-{user}"})
        await client.flush(timeout=5)
        for _ in range(40):
            if errors:
                break
            await asyncio.sleep(0.05)
    finally:
        await client.close()
    with pytest.raises(NotFoundError):
        await admin.jetstream().get_last_msg(stream, subject)
    return errors


def _execute_action() -> bytes:
    action = CmdRunAction(task_id=TASK, source=EventSource.AGENT, command="touch /tmp/pwned")
    order: Any = ExecuteAction(task_id=TASK, action=action)
    return str(order.model_dump_json()).encode()


async def test_a_client_without_credentials_is_refused(stack: Stack) -> None:
    servers = stack.config.nats_url.split(",")
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(servers=servers, allow_reconnect=False, connect_timeout=5)
    with pytest.raises(Exception, match=r"(?i)authorization"):
        await nats.connect(
            servers=servers, user="reasoner", password="guessed", allow_reconnect=False
        )


async def test_the_reasoner_cannot_order_the_runtime(stack: Stack, admin: Client) -> None:
    errors = await _refused_publish(
        stack, admin, "reasoner", f"deckhands.work.runtime.{TASK}", _execute_action()
    )
    assert any("permissions violation for publish" in e for e in errors), errors


async def test_only_the_controller_and_runtime_route_an_order_to_a_runtime_replica(
    stack: Stack, admin: Client
) -> None:
    for user in ("reasoner", "gateway", "security", "storage"):
        errors = await _refused_publish(
            stack,
            admin,
            user,
            f"deckhands.routed.runtime.node-a.{TASK}",
            _execute_action(),
            ROUTED_STREAM,
        )
        assert any("permissions violation for publish" in e for e in errors), (user, errors)


async def test_the_runtime_may_use_any_replica_queue_but_no_other_service_s_consumer(
    stack: Stack, admin: Client
) -> None:
    errors: list[str] = []
    client = await _client(stack, "runtime", errors)
    try:
        # Another replica's queue: allowed (a gone replica's is drained by the others).
        js = client.jetstream(timeout=5)
        sub = await js.pull_subscribe(
            "deckhands.routed.runtime.node-z.*",
            durable="runtime_node-z",
            stream=ROUTED_STREAM,
            inbox_prefix=b"_INBOX_runtime.",
        )
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)
        # The controller's consumer of WORK: refused.
        with pytest.raises(nats.errors.TimeoutError):
            await client.request("$JS.API.CONSUMER.MSG.NEXT.DECKHANDS_WORK.controller", b"1", 2)
    finally:
        await client.close()
    assert any("consumer.msg.next.deckhands_work.controller" in e.lower() for e in errors), errors
    assert not any("runtime_node-z" in e for e in errors), errors


async def test_no_service_but_the_controller_and_reasoner_orders_a_review(
    stack: Stack, admin: Client
) -> None:
    for user in ("runtime", "gateway", "storage"):
        errors = await _refused_publish(
            stack, admin, user, f"deckhands.work.security.{TASK}", _execute_action()
        )
        assert any("permissions violation for publish" in e for e in errors), (user, errors)


async def test_storage_cannot_forge_a_verdict(stack: Stack, admin: Client) -> None:
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause="a1",
        risk=RiskLevel.LOW,
        verdict=Verdict.ALLOW,
    )
    errors = await _refused_publish(
        stack,
        admin,
        "storage",
        f"deckhands.work.controller.{TASK}",
        verdict.model_dump_json().encode(),
    )
    assert any("permissions violation for publish" in e for e in errors), errors


async def test_a_service_cannot_delete_or_read_around(stack: Stack, admin: Client) -> None:
    errors: list[str] = []
    client = await _client(stack, "reasoner", errors)
    try:
        with pytest.raises(nats.errors.TimeoutError):  # the request is dropped: no answer
            await client.jetstream(timeout=2).delete_stream(EVENTS_STREAM)
        # The log's live subjects are the gateway's and storage's to read, not the reasoner's.
        await client.subscribe("deckhands.events.*")
        await client.flush(timeout=2)
        await asyncio.sleep(0.5)
    finally:
        await client.close()
    assert any('publish to "$js.api.stream.delete' in e for e in errors), errors
    assert any('subscription to "deckhands.events.*"' in e for e in errors), errors
    info = await admin.jetstream().stream_info(EVENTS_STREAM)
    assert info.config.name == EVENTS_STREAM


def test_redis_refuses_no_password_and_dangerous_commands(stack: Stack) -> None:
    anonymous = redis.Redis(port=stack.config.redis_port, socket_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(port=stack.config.redis_port, password="guessed", socket_timeout=5).ping()
    controller = redis.Redis(**stack.redis_login("controller"), socket_timeout=5)
    assert controller.ping()
    with pytest.raises(redis.exceptions.NoPermissionError):
        controller.flushall()
    with pytest.raises(redis.exceptions.NoPermissionError):
        controller.config_set("requirepass", "")
    # The security monitor has no Redis user at all.
    assert "security" not in stack.credentials.redis
    assert json.dumps(sorted(stack.credentials.redis)) == json.dumps(
        sorted(["admin", "controller", "egress", "gateway", "reasoner", "runtime"])
    )
    # The egress proxy's user reads secrets and writes its byte counts, and nothing else: a
    # proxy broken into reads no State, holds no seat, and runs no script.
    egress = redis.Redis(**stack.redis_login("egress"), socket_timeout=5)
    assert egress.ping()
    for refused in (
        lambda: egress.get("deckhands:task:some-task"),
        lambda: egress.hgetall("deckhands:seats:default:seats"),
        lambda: egress.set("deckhands:egress-allowances", "x"),
        lambda: egress.eval("return 1", 0),
        lambda: egress.keys("*"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
