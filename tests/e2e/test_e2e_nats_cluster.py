"""A three-node JetStream cluster loses a server, gets it back, then loses another, while tasks
run through the real services: every task finishes, its log has no gap, and every command ran
once (in the sandbox: each appends a line to a file the last command prints).

The first server killed is the leader of the work queue stream, the second the leader of the
event log after the first came back and caught up: each kill forces a leader election on a
stream the services are using at that moment."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from e2e_helpers import get_until_ok, wait_until_ended  # type: ignore[import-not-found]

from shared.subjects import EVENTS_STREAM, WORK_STREAM
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

TASKS = 8
COMMANDS = 5
LEDGER = "ran.txt"


def _script() -> dict[str, Any]:
    turns: list[dict[str, Any]] = [
        {
            "tool": "execute_bash",
            "arguments": {"command": f"echo step {i} >> {LEDGER}"},
            "delay_s": 0.4,
        }
        for i in range(COMMANDS)
    ]
    turns.append({"tool": "execute_bash", "arguments": {"command": f"cat {LEDGER}"}})
    turns.append({"tool": "finish", "arguments": {"message": "ran: {{last_tool_output}}"}})
    return {"model": "scripted", "turns": turns}


async def _cluster_view(login: dict[str, Any], stream: str) -> tuple[str, bool]:
    """The stream's leader, and whether every replica is current."""
    nc = await nats.connect(**login, connect_timeout=3, max_reconnect_attempts=2)
    try:
        info = await nc.jetstream(timeout=3).stream_info(stream)
        cluster = info.cluster
        assert cluster is not None and cluster.leader, f"{stream} has no leader: {cluster}"
        replicas = cluster.replicas or []
        caught_up = len(replicas) == 2 and all(r.current and not r.offline for r in replicas)
        return cluster.leader, caught_up
    finally:
        await nc.close()


def _wait_for(stack: Stack, stream: str, *, caught_up: bool, timeout_s: float = 60) -> str:
    """The stream's leader, once it has one (and, if asked, every replica is current)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            leader, current = asyncio.run(_cluster_view(stack.nats_login(), stream))
            if current or not caught_up:
                return leader
            last = f"leader {leader}, replicas not current"
        except Exception as exc:  # an election in progress, a server still starting
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{stream}: no {'current ' if caught_up else ''}leader: {last}")


def test_tasks_survive_losing_one_nats_server_then_another(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        tmp_path / "run",
        nats_nodes=3,
        llm_script=script,
        extra_env={"DECKHANDS_ACK_WAIT_S": "5", "DECKHANDS_POOL_MIN_IDLE": "2"},
    )
    with (
        running(config) as stack,
        httpx.Client(
            base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=10
        ) as client,
    ):
        assert _wait_for(stack, WORK_STREAM, caught_up=True)  # three replicas, all current
        ids = []
        for i in range(TASKS):
            response = client.post("/v1/tasks", json={"task": f"cluster {i}", "max_iterations": 20})
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])

        kills: list[str] = []
        failures: list[BaseException] = []

        def kill_leaders() -> None:
            try:
                for stream in (WORK_STREAM, EVENTS_STREAM):
                    time.sleep(2.0)
                    victim = _wait_for(stack, stream, caught_up=True)
                    stack.kill_service(victim)
                    kills.append(victim)
                    time.sleep(3.0)  # tasks go on with two servers of three
                    stack.start_service(victim)
            except BaseException as exc:
                failures.append(exc)

        chaos = threading.Thread(target=kill_leaders, daemon=True)
        chaos.start()
        views = wait_until_ended(client, ids, 240)
        chaos.join(60)
        assert not failures, failures
        assert len(kills) == 2 and len(set(kills)) >= 1, kills

        assert len(views) == TASKS, f"{TASKS - len(views)} tasks never ended"
        assert {v["state"] for v in views.values()} == {"FINISHED"}, [
            (v["state"], v["reason"]) for v in views.values()
        ]
        expected_ledger = "\n".join(f"step {i}" for i in range(COMMANDS))
        for task_id in ids:
            events = get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"]
            seqs = [e["seq"] for e in events]
            assert seqs == list(range(1, len(seqs) + 1)), f"gap or repeat in {task_id}: {seqs}"
            runs = [e for e in events if e["kind"] == "run"]
            assert len({e["id"] for e in runs}) == len(runs), f"{task_id}: an action id twice"
            commands = Counter(e["command"] for e in runs)
            assert commands == Counter(
                [f"echo step {i} >> {LEDGER}" for i in range(COMMANDS)] + [f"cat {LEDGER}"]
            ), commands
            answers = Counter(
                e["cause"] for e in events if e["kind"] == "run_output" and e.get("cause")
            )
            others = [
                (e["kind"], e.get("error_code"), str(e.get("content") or e.get("message"))[:200])
                for e in events
                if e.get("cause") in {r["id"] for r in runs} and e["kind"] != "run_output"
            ]
            assert answers == Counter(e["id"] for e in runs), f"{task_id}: {answers}; {others}"
            [finish] = [e for e in events if e["kind"] == "finish"]
            # Every command ran once in the sandbox, whatever NATS redelivered: the file they
            # appended to holds each line once, in order.
            said = json.dumps(finish)
            assert json.dumps(expected_ledger)[1:-1] in said, finish
            assert all(said.count(f"step {i}") == 1 for i in range(COMMANDS)), finish
