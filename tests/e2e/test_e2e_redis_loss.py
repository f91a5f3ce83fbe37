"""Redis loses everything while tasks run (issue 12, part 2): first a FLUSHALL, then
redis-server killed and started again on an empty data directory. The controller rebuilds
every live task's State from its log, the runtime binds its sandboxes again, and every task
finishes with a gap-free log and each action run once.

Tenants, API keys, limits, task owners and Idempotency-Keys are kept in NATS key-value (Redis
only caches them): the key made before the loss still works, the tenant's limits still hold, a
task made before the loss is still its tenant's (found, listed, hidden from others), and its
Idempotency-Key still names it. Ended tasks' States are rebuilt from their logs too.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
import redis

from services.controller.task_log import TaskLog, has_ended
from shared.events import AgentStateChangedObservation, EventBase
from shared.state import TaskState
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

FLUSHED_TASKS = 10
RESTARTED_TASKS = 6
COMMANDS = 5
SLEEPER = "sleep 2; echo slept"  # a task is likely in the middle of it when Redis goes


def _script() -> dict[str, Any]:
    turns: list[dict[str, Any]] = [
        {"tool": "execute_bash", "arguments": {"command": f"echo step {i}"}, "delay_s": 0.4}
        for i in range(COMMANDS)
    ]
    turns.insert(2, {"tool": "execute_bash", "arguments": {"command": SLEEPER}})
    turns.append({"tool": "finish", "arguments": {"message": "done: {{last_tool_output}}"}})
    return {"model": "scripted", "turns": turns}


def _post(client: httpx.Client, n: int, label: str) -> list[str]:
    ids = []
    for i in range(n):
        response = client.post(
            "/v1/tasks", json=_task(label, i), headers={"Idempotency-Key": f"{label}-{i}"}
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


def _task(label: str, i: int) -> dict[str, Any]:
    return {"task": f"{label} {i}", "max_iterations": 30}


def _listed(client: httpx.Client) -> set[str]:
    """Every task id the tenant's listing gives, page after page."""
    ids: set[str] = set()
    params: dict[str, Any] = {"limit": 100}
    while True:
        page = client.get("/v1/tasks", params=params)
        assert page.status_code == 200, page.text
        body = page.json()
        ids.update(task["id"] for task in body["tasks"])
        if not body.get("next_cursor"):
            return ids
        params["cursor"] = body["next_cursor"]


def _state(store: redis.Redis, task_id: str) -> TaskState | None:
    try:
        raw = store.hget(f"deckhands:task:{task_id}", "state")
    except redis.ConnectionError:
        return None  # being restarted
    return None if raw is None else TaskState.model_validate_json(raw)  # type: ignore[arg-type]


def _last_entries(stack: Stack, ids: list[str]) -> dict[str, EventBase | None]:
    async def read() -> dict[str, EventBase | None]:
        nc = await nats.connect(**stack.nats_login())
        try:
            js = nc.jetstream()
            log = TaskLog(lambda: js)
            return {task_id: await log.last_entry(task_id) for task_id in ids}
        finally:
            await nc.close()

    return asyncio.run(read())


def _live(stack: Stack, ids: list[str]) -> set[str]:
    """The tasks whose log does not end them: those the controller must rebuild unasked (an
    ended task is rebuilt when a message resumes it)."""
    return {t for t, last in _last_entries(stack, ids).items() if last and not has_ended(last)}


def _wait_all_ended(stack: Stack, ids: list[str], timeout_s: float) -> None:
    """Until every task's log ends it: the log, not Redis, says when a task is over."""
    deadline = time.monotonic() + timeout_s
    while _live(stack, ids) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _live(stack, ids)
    assert not left, f"{len(left)} tasks never ended"


def _wait_mid_run(store: redis.Redis, ids: list[str]) -> None:
    """Until every task has run its first command: Redis goes while they are under way."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = [_state(store, t) for t in ids]
        if all(s is not None and s.iteration >= 2 for s in states):
            return
        time.sleep(0.2)
    raise AssertionError("the tasks did not start")


def _logs(stack: Stack, ids: list[str]) -> dict[str, list[EventBase]]:
    async def read() -> dict[str, list[EventBase]]:
        nc = await nats.connect(**stack.nats_login())
        try:
            js = nc.jetstream()
            log = TaskLog(lambda: js)
            return {task_id: await log.read(task_id) for task_id in ids}
        finally:
            await nc.close()

    return asyncio.run(read())


def _check_logs(stack: Stack, store: redis.Redis, ids: list[str], live: set[str]) -> None:
    logs = _logs(stack, ids)
    for task_id in ids:
        events = logs[task_id]
        seqs = [e.seq for e in events]
        assert seqs == list(range(1, len(seqs) + 1)), f"gap or repeat in {task_id}: {seqs}"
        last = events[-1]
        assert isinstance(last, AgentStateChangedObservation), (task_id, last)
        assert last.agent_state.value == "FINISHED", (task_id, last.reason)
        state = _state(store, task_id)
        if task_id in live:  # rebuilt, and on to the end
            assert state is not None and state.agent_state.value == "FINISHED", task_id
            assert state.last_seq == len(events)
        else:  # it ended about when Redis went: rebuilt by its last input, or not at all
            assert state is None or state.agent_state.value == "FINISHED", task_id
        kinds = [getattr(e, "kind", "") for e in events]
        assert kinds[0] == "task_created"
        runs = [e for e in events if getattr(e, "kind", "") == "run"]
        commands = Counter(getattr(e, "command", "") for e in runs)
        expected = Counter([*(f"echo step {i}" for i in range(COMMANDS)), SLEEPER])
        assert commands == expected, (task_id, commands)
        run_ids = {e.id for e in runs}
        answers = Counter(
            e.cause
            for e in events
            if getattr(e, "kind", "") in {"run_output", "error"} and e.cause in run_ids
        )
        assert answers == Counter(run_ids), f"{task_id}: {answers}"
        # Each command's output says it ran once: a second run would have been answered by
        # a second output, or refused as not awaited (an error of kind order_refused).
        assert all(getattr(e, "error_code", "") != "order_refused" for e in events), (
            f"{task_id}: an order was refused"
        )
        assert kinds.count("finish") == 1


def _rebuilt(stack: Stack) -> int:
    return (stack.logs / "controller.log").read_text().count("State rebuilt from its log")


def _empty_redis_restart(stack: Stack) -> None:
    stack.kill_service("redis")
    data = stack.config.run_dir / "redis"
    shutil.rmtree(data, ignore_errors=True)
    stack.start_service("redis")


def test_tasks_finish_when_redis_loses_everything(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        tmp_path / "run",
        llm_script=script,
        extra_env={"DECKHANDS_ACK_WAIT_S": "5", "DECKHANDS_POOL_HEALTH_INTERVAL_S": "2"},
    )
    with running(config) as stack:
        admin = redis.Redis(**stack.redis_login("admin"))
        gateway = stack.config.gateway_url
        limits = httpx.put(
            f"{gateway}/v1/admin/tenants/{stack.config.tenant}/limits",
            json={"max_event_streams": 7, "max_running_tasks": 900},
            headers={"Authorization": f"Bearer {stack.admin_api_key}"},
            timeout=10,
        )
        assert limits.status_code == 200, limits.text
        with httpx.Client(base_url=gateway, headers=stack.auth_headers, timeout=10) as client:
            first = _post(client, FLUSHED_TASKS, "flushed")
            _wait_mid_run(admin, first)
            admin.flushall()
            live = _live(stack, first)
            assert live  # most, unless some finished first
            # The key and the tenant's limits are durable: Redis refills from NATS.
            assert client.get("/v1/tasks").status_code == 200
            quotas = client.get("/v1/quotas")
            assert quotas.status_code == 200, quotas.text
            in_force = quotas.json()["limits"]
            assert (in_force["max_event_streams"], in_force["max_running_tasks"]) == (7, 900)
        _wait_all_ended(stack, first, 240)
        _check_logs(stack, admin, first, live)
        rebuilt = _rebuilt(stack)
        assert rebuilt >= len(live)  # every live task, none waiting for its own next input

        stack.ensure_api_key()  # the operator issues the tenant a key again
        with httpx.Client(base_url=gateway, headers=stack.auth_headers, timeout=10) as client:
            kept = client.get(f"/v1/tasks/{first[0]}")
            assert kept.status_code == 200, kept.text  # its owner is durable
            assert kept.json()["state"] == "FINISHED"
            listed = _listed(client)
            assert set(first) <= listed, set(first) - listed
            # The request sent again with its Idempotency-Key names the same task.
            again = client.post(
                "/v1/tasks", json=_task("flushed", 0), headers={"Idempotency-Key": "flushed-0"}
            )
            assert again.status_code in (200, 202), again.text
            assert again.json()["id"] == first[0], again.text
            second = _post(client, RESTARTED_TASKS, "restarted")
            _wait_mid_run(admin, second)
            _empty_redis_restart(stack)
            live = _live(stack, second)
            assert live
            _wait_all_ended(stack, second, 240)
            _check_logs(stack, admin, second, live)
        assert _rebuilt(stack) >= rebuilt + len(live)
        assert "task sandboxes bound again" in (stack.logs / "runtime.log").read_text()
        admin.close()
