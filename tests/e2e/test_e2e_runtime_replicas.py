"""Two runtime replicas: each task's actions run in one sandbox, on the replica holding it, and
the tasks of a replica killed with SIGKILL (and never started again) carry on elsewhere, with
no action run twice.

The two replicas (`ra`, `rb`: two processes with their own DECKHANDS_RUNTIME_REPLICA, their own
queue, warm pool and heartbeats) share this machine's one Docker engine: the survivor adopts
the dead replica's sandboxes, workspace included. On two engines it would instead report each
workspace lost and go on in a fresh sandbox (tests/integration/runtime/test_runtime_replicas.py
covers that path).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import docker
import httpx
import pytest
from e2e_helpers import get_until_ok, wait_until_ended  # type: ignore[import-not-found]

from tools.procs import free_port
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

TASKS = 6
COMMANDS = 6
LLM_S = 1.5
TTL_S = 6


def _script() -> dict[str, Any]:
    # Each command appends its step to a file of the workspace and shows the file and the
    # sandbox it ran in: a step run twice, or in another sandbox, shows.
    turns: list[dict[str, Any]] = [
        {
            "tool": "execute_bash",
            "arguments": {
                # The sleep: a replica killed at a random moment may be killed mid-action.
                "command": f"echo step {i} >> /workspace/steps && sleep 1 && echo sandbox "
                "$(hostname) && cat /workspace/steps"
            },
            "delay_s": LLM_S,
        }
        for i in range(COMMANDS)
    ]
    turns.append({"tool": "finish", "arguments": {"message": "done: {{last_tool_output}}"}})
    return {"model": "scripted", "turns": turns}


def _outputs(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "run_output"]


def _sandbox(output: dict[str, Any]) -> str:
    return next(
        line.split()[1] for line in output["content"].splitlines() if line.startswith("sandbox ")
    )


@contextmanager
def _two_replicas(tmp_path: Path) -> Iterator[tuple[Stack, httpx.Client]]:
    """A stack on the script above with two runtime replicas, `ra` and `rb`, and a client."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        tmp_path / "run",
        llm_script=script,
        extra_env={
            "DECKHANDS_ACK_WAIT_S": "5",
            "DECKHANDS_POOL_HEALTH_INTERVAL_S": "2",
            "DECKHANDS_POOL_MIN_IDLE": "1",
            "DECKHANDS_REPLICA_TTL_S": str(TTL_S),
            # The stack's runtime; the second one below overrides it.
            "DECKHANDS_RUNTIME_REPLICA": "ra",
        },
    )
    with (
        running(config) as stack,
        httpx.Client(
            base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=10
        ) as client,
    ):
        stack.start_replica(
            "runtime-b",
            "runtime",
            {"DECKHANDS_RUNTIME_REPLICA": "rb", "DECKHANDS_METRICS_PORT": str(free_port())},
        )
        time.sleep(3)  # rb's consumers exist before the first orders
        yield stack, client


def test_tasks_follow_their_sandbox_and_survive_a_replica_killed(tmp_path: Path) -> None:
    with _two_replicas(tmp_path) as (stack, client):
        ids = []
        for i in range(TASKS):
            response = client.post(
                "/v1/tasks", json={"task": f"replicas {i}", "max_iterations": 30}
            )
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])

        # Once every task ran two commands: kill the replica holding the most of them.
        holders: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(holders) < TASKS and time.monotonic() < deadline:
            for task_id in ids:
                outputs = _outputs(
                    get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"]
                )
                if len(outputs) >= 2:
                    holders[task_id] = outputs[-1]["runtime_replica"]
            time.sleep(0.5)
        assert len(holders) == TASKS, f"tasks that ran 2 commands: {holders}"
        held = Counter(holders.values())
        victim = max(("ra", "rb"), key=lambda r: held[r])
        stack.kill_service("runtime" if victim == "ra" else "runtime-b")
        survivor = "rb" if victim == "ra" else "ra"
        moved = {t for t, r in holders.items() if r == victim}
        assert moved, held

        views = wait_until_ended(client, ids, 240)
        assert len(views) == TASKS, f"{TASKS - len(views)} tasks never ended"
        assert {v["state"] for v in views.values()} == {"FINISHED"}, [
            (v["state"], v["reason"]) for v in views.values()
        ]

        for task_id in ids:
            events = get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"]
            log = [(e["seq"], e["kind"], e.get("runtime_replica")) for e in events]
            runs = [e for e in events if e["kind"] == "run"]
            assert len(runs) == COMMANDS, log
            # Each action answered once: its output, or (its replica killed while it ran) an
            # error saying it was interrupted and not run again.
            run_ids = {e["id"] for e in runs}
            answers = Counter(
                e["cause"]
                for e in events
                if e["kind"] in {"run_output", "error"} and e.get("cause") in run_ids
            )
            assert answers == Counter(run_ids), log
            outputs = _outputs(events)
            # One sandbox for the whole task: the survivor adopted the victim's (one engine).
            assert len({_sandbox(o) for o in outputs}) == 1, log
            replicas = [o["runtime_replica"] for o in outputs]
            if task_id in moved:
                assert replicas[-1] == survivor, log
            else:
                assert set(replicas) == {holders[task_id]}, log
            # No step ran twice: the workspace's file has each step at most once, in order.
            steps = [
                line for line in outputs[-1]["content"].splitlines() if line.startswith("step ")
            ]
            assert len(steps) == len(set(steps)), steps
            assert steps == sorted(steps, key=lambda line: int(line.split()[1])), steps
            ran = {o["command"].split(" >>")[0].removeprefix("echo ") for o in outputs}
            assert ran <= set(steps), (ran, steps)

        # The victim's tasks went on because the survivor took the orders queued for the victim
        # (the controller kept routing there until a survivor's answer named the survivor).
        survivor_log = stack.logs / ("runtime.log" if survivor == "ra" else "runtime-b.log")
        assert f"runtime replica {victim} is gone" in survivor_log.read_text()


def test_tasks_whose_replica_and_sandboxes_are_lost_finish_with_their_files(
    tmp_path: Path,
) -> None:
    """Issue 28, item 3: a replica killed with its engine's sandboxes (as when its machine is
    lost): its tasks go on on the other replica, in new sandboxes whose /workspace is their
    last checkpoint."""
    with (
        closing(docker.from_env(timeout=60)) as engine,
        _two_replicas(tmp_path) as (
            stack,
            client,
        ),
    ):
        ids = [
            client.post("/v1/tasks", json={"task": f"lost {i}", "max_iterations": 30}).json()["id"]
            for i in range(4)
        ]
        # Once every task ran two commands and their checkpoints are stored.
        holders: dict[str, str] = {}
        deadline = time.monotonic() + 120
        while len(holders) < len(ids) and time.monotonic() < deadline:
            for task_id in ids:
                events = get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"]
                outputs = _outputs(events)
                kept = [
                    e for e in events if e["kind"] == "workspace_checkpoint" and e["checkpoint"]
                ]
                if len(outputs) >= 2 and len(kept) >= 2:
                    holders[task_id] = outputs[-1]["runtime_replica"]
            time.sleep(0.5)
        assert len(holders) == len(ids), f"tasks with 2 checkpoints: {holders}"
        victim = max(("ra", "rb"), key=lambda r: Counter(holders.values())[r])
        stack.kill_service("runtime" if victim == "ra" else "runtime-b")
        moved = {t for t, r in holders.items() if r == victim}
        assert moved, holders
        # Its machine is gone: so are the sandboxes on it (each named for its task).
        for task_id in moved:
            engine.containers.get(f"deckhands-task-{task_id}").remove(force=True)

        views = wait_until_ended(client, ids, 240)
        assert {v["state"] for v in views.values()} == {"FINISHED"}, [
            (v["state"], v["reason"]) for v in views.values()
        ]
        for task_id in moved:
            outputs = _outputs(get_until_ok(client, f"/v1/tasks/{task_id}/trajectory")["events"])
            restored = [o for o in outputs if "was restored from the checkpoint" in o["content"]]
            assert restored, [o["content"][:200] for o in outputs]
            steps = [
                line for line in outputs[-1]["content"].splitlines() if line.startswith("step ")
            ]
            # The steps from before the loss came back with the files; none twice.
            assert steps[:2] == ["step 0", "step 1"], steps
            assert len(steps) == len(set(steps)), steps
