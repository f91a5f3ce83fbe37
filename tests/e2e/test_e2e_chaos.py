"""Kill everything: tasks keep running while each service, NATS and Redis are killed with
SIGKILL and started again, one after another. Every task finishes with a gap-free log, every
action once, no step lost."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_helpers import get_until_ok, wait_until_ended  # type: ignore[import-not-found]

from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

TASKS = 12
COMMANDS = 8
# Each task waits at least COMMANDS x LLM_S for its LLM, longer than one round of kills
# (VICTIMS x about KILL_EVERY_S): every component dies while every task still runs.
LLM_S = 2.0
KILL_EVERY_S = 2.0
VICTIMS = ("controller", "reasoner", "runtime", "storage", "security", "nats", "redis", "gateway")


def _script() -> dict[str, Any]:
    turns: list[dict[str, Any]] = [
        {"tool": "execute_bash", "arguments": {"command": f"echo step {i}"}, "delay_s": LLM_S}
        for i in range(COMMANDS)
    ]
    turns.append({"tool": "finish", "arguments": {"message": "done: {{last_tool_output}}"}})
    return {"model": "scripted", "turns": turns}


def test_every_task_survives_sigkill_of_every_component(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        tmp_path / "run",
        llm_script=script,
        extra_env={"DECKHANDS_ACK_WAIT_S": "5", "DECKHANDS_POOL_HEALTH_INTERVAL_S": "2"},
    )
    with (
        running(config) as stack,
        httpx.Client(
            base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=10
        ) as client,
    ):
        ids = []
        for i in range(TASKS):
            response = client.post("/v1/tasks", json={"task": f"chaos {i}", "max_iterations": 30})
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])

        kills: list[str] = []
        stop = threading.Event()

        def chaos(stack: Stack) -> None:
            for victim in VICTIMS * 2:
                if stop.wait(KILL_EVERY_S):
                    return
                stack.kill_service(victim)
                kills.append(victim)
                time.sleep(0.3)
                stack.start_service(victim)

        monkey = threading.Thread(target=chaos, args=(stack,), daemon=True)
        monkey.start()
        views = wait_until_ended(client, ids, 300)
        stop.set()
        monkey.join(60)
        assert len(kills) >= len(VICTIMS), kills  # every component died at least once

        assert len(views) == TASKS, f"{TASKS - len(views)} tasks never ended"
        assert {v["state"] for v in views.values()} == {"FINISHED"}, [
            (v["state"], v["reason"]) for v in views.values()
        ]
        for task_id in ids:
            events = get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"]
            seqs = [e["seq"] for e in events]
            assert seqs == list(range(1, len(seqs) + 1)), f"gap or repeat in {task_id}: {seqs}"
            runs = [e for e in events if e["kind"] == "run"]
            commands = Counter(e["command"] for e in runs)
            assert commands == Counter(f"echo step {i}" for i in range(COMMANDS)), commands
            # Each action answered once: by its output, or (the runtime killed while it ran) by
            # an error saying it was interrupted and not run again.
            run_ids = {e["id"] for e in runs}
            answers = Counter(
                e["cause"]
                for e in events
                if e["kind"] in {"run_output", "error"} and e.get("cause") in run_ids
            )
            log = [(e["seq"], e["kind"], e.get("cause")) for e in events]
            assert answers == Counter(run_ids), f"{task_id}: {answers}; log: {log}"
            assert sum(1 for e in events if e["kind"] == "finish") == 1
