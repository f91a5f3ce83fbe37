"""Admission through the real services (separate processes, real NATS, Redis and Docker): tasks
beyond the pool's seats wait in a visible first-come-first-served queue holding nothing, every
task finishes, the maximum holds across a runtime restart, and tasks that wait for a person give
their seat to the queue."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
import redis

from shared.admission import seats_prefix
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

SEATS = 20
TASKS = 200


def _script() -> dict[str, Any]:
    short = [
        {"tool": "execute_bash", "arguments": {"command": "echo one"}, "delay_s": 0.2},
        {"tool": "execute_bash", "arguments": {"command": "echo two"}, "delay_s": 0.2},
        {"tool": "finish", "arguments": {"message": "done: {{last_tool_output}}"}},
    ]
    hold = [
        {"tool": "execute_bash", "arguments": {"command": "echo kept > /workspace/held.txt"}},
        {"content": "Shall I go on?"},
        {"tool": "execute_bash", "arguments": {"command": "cat /workspace/held.txt"}},
        {"tool": "finish", "arguments": {"message": "file: {{last_tool_output}}"}},
    ]
    return {
        "model": "scripted",
        "conversations": [{"match": "hold:", "turns": hold}, {"match": "short:", "turns": short}],
        "turns": short,
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("admission"))
    script = run_dir / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        run_dir,
        llm_script=script,
        extra_env={
            "DECKHANDS_MAX_SANDBOXES": str(SEATS),
            # All the tasks are one tenant's: its quotas must not be what queues them.
            "DECKHANDS_TENANT_MAX_RUNNING_TASKS": str(TASKS),
            "DECKHANDS_POOL_HEALTH_INTERVAL_S": "1",
            "DECKHANDS_QUEUE_PREEMPT_AFTER_S": "2",
        },
    )
    with running(config) as stack:
        yield stack


class Watch:
    """Samples, until stopped, the running task sandboxes of the pool and the seats taken."""

    def __init__(self, stack: Stack) -> None:
        self.pool = stack.config.pool_name
        self.docker = docker.from_env(timeout=30)
        self.redis = redis.Redis(**stack.redis_login())
        self.most_running = 0
        self.most_seats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def running_task_sandboxes(self) -> int:
        # One list call (the high-level list inspects each container, racing removals).
        found = self.docker.api.containers(
            filters={"label": f"deckhands.pool={self.pool}", "status": "running"}
        )
        return sum(1 for c in found if any(n.startswith("/deckhands-task-") for n in c["Names"]))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.most_running = max(self.most_running, self.running_task_sandboxes())
            seats = int(self.redis.hlen(f"{seats_prefix(self.pool)}:seats"))  # type: ignore[arg-type]
            self.most_seats = max(self.most_seats, seats)
            self._stop.wait(0.3)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.docker.close()
        self.redis.close()


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


async def _post(client: httpx.AsyncClient, text: str) -> str:
    response = await client.post("/v1/tasks", json={"task": text})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


async def _until_ended(
    client: httpx.AsyncClient, ids: list[str], timeout_s: float, positions: dict[str, int]
) -> dict[str, dict[str, Any]]:
    views: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    while len(views) < len(ids) and time.monotonic() < deadline:
        for task_id in [t for t in ids if t not in views]:
            view = (await client.get(f"/v1/tasks/{task_id}")).json()
            if view.get("queue_position") is not None:
                positions.setdefault(task_id, view["queue_position"])
            if view["state"] in {"FINISHED", "ERROR", "STOPPED", "REJECTED"}:
                views[task_id] = view
        await asyncio.sleep(0.5)
    missing = [t for t in ids if t not in views]
    assert not missing, f"{len(missing)} tasks did not end in {timeout_s:g}s, e.g. {missing[:3]}"
    return views


async def _events(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v1/tasks/{task_id}/trajectory")
    return list(response.json()["events"])


def test_200_tasks_share_20_seats_first_come_first_served(stack: Stack) -> None:
    async def scenario() -> tuple[
        list[str], dict[str, dict[str, Any]], dict[str, int], dict[str, list[Any]]
    ]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(
            base_url=stack.config.gateway_url,
            headers=stack.auth_headers,
            timeout=30,
            limits=limits,
        ) as client:
            ids = [await _post(client, f"short: task {i}") for i in range(TASKS)]
            positions: dict[str, int] = {}
            views = await _until_ended(client, ids, 420, positions)
            logs = {t: await _events(client, t) for t in ids}
        return ids, views, positions, logs

    with Watch(stack) as watch:
        ids, views, positions, logs = asyncio.run(scenario())

    states = [v["state"] for v in views.values()]
    assert states.count("FINISHED") == TASKS, states
    assert watch.most_seats <= SEATS
    assert 0 < watch.most_running <= SEATS
    # The queue was visible on the task view while waiting (its first step waits for its
    # seat, so a queued task's log holds nothing yet: services/reasoner/seat_wait.py).
    # (sampled: each view is read every second or so, and some wait less than that)
    assert len(positions) >= TASKS // 2, len(positions)
    assert all(p >= 1 for p in positions.values())
    # First come, first served: tasks posted (and queued) first ran their first command first.
    queued = [t for t in ids if t in positions]
    first_run = {t: min(_ts(e) for e in logs[t] if e["kind"] == "run_output") for t in queued}
    quarter = len(queued) // 4
    assert max(first_run[t] for t in queued[:quarter]) <= min(
        first_run[t] for t in queued[-quarter:]
    )


def test_a_restart_below_the_seats_in_use_admits_nobody_until_seats_free(stack: Stack) -> None:
    """Six tasks hold sandboxes and wait for a person; the runtime is killed and comes back
    with 3 seats. New tasks queue (no overshoot); the waiting tasks' sandboxes are stopped, files
    kept, and their seats go to the queue; answered, the waiting tasks get a seat again and find
    their files."""
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
    ) as client:
        holders = [
            client.post("/v1/tasks", json={"task": f"hold: {i}"}).json()["id"] for i in range(6)
        ]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            views = [client.get(f"/v1/tasks/{t}").json() for t in holders]
            if all(v["state"] == "AWAITING_USER_INPUT" for v in views):
                break
            time.sleep(0.3)
        assert all(v["state"] == "AWAITING_USER_INPUT" for v in views), views

        stack.kill_service("runtime")
        stack.config.extra_env["DECKHANDS_MAX_SANDBOXES"] = "3"
        try:
            stack.start_service("runtime")
            with Watch(stack) as watch:
                assert watch.running_task_sandboxes() == 6
                newcomers = [
                    client.post("/v1/tasks", json={"task": f"short: new {i}"}).json()["id"]
                    for i in range(5)
                ]

                async def wait_new() -> dict[str, dict[str, Any]]:
                    async with httpx.AsyncClient(
                        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
                    ) as ac:
                        return await _until_ended(ac, newcomers, 180, positions)

                positions: dict[str, int] = {}
                ended = asyncio.run(wait_new())
                assert all(v["state"] == "FINISHED" for v in ended.values()), ended
                assert positions, "no newcomer waited: the restart let it overshoot the seats"
                # Never more running than before the restart, and the six gave way.
                assert watch.most_running <= 6

                for task_id in holders:
                    sent = client.post(f"/v1/tasks/{task_id}/messages", json={"content": "go on"})
                    assert sent.status_code == 202, sent.text

                async def wait_holders() -> dict[str, dict[str, Any]]:
                    async with httpx.AsyncClient(
                        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
                    ) as ac:
                        return await _until_ended(ac, holders, 180, {})

                finished = asyncio.run(wait_holders())
            assert watch.most_seats <= 6
        finally:
            stack.config.extra_env["DECKHANDS_MAX_SANDBOXES"] = str(SEATS)
        for view in finished.values():
            assert view["state"] == "FINISHED", view
            message = view["result"]["final_message"]
            # Its sandbox was stopped for the queue and started again with its files.
            assert "The sandbox was stopped while the task waited" in message, message
            assert "\nkept\n" in message, message
