"""Benchmark of forks (issue 28, item 2) on this machine (a benchmark, not a test).

    .venv/bin/python bench/fork_bench.py [--steps 20] [--forks 10] [--files 500]

Starts its own isolated stack (tools.stack: gateway, controller, reasoner on a scripted LLM,
security, runtime on the Docker engine, storage, NATS, Redis), runs a parent task of --steps
commands (the first makes a workspace of --files files of 10 KB), then forks it at its last
command's output into --forks tasks at once, each of which runs one command. Printed beside a
baseline from the same run, --forks new tasks posted at once whose first command is the same:
  - from the request to each task's first own action (logged), p50 and max;
  - from the request to that action's observation (its sandbox started, a fork's files
    restored), p50 and max.
The stack and every sandbox it started are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tools.stack import Stack, StackConfig, running  # noqa: E402

FIRST = "echo one more > after.txt && ls | wc -l"


def _script(path: Path, steps: int, files: int) -> Path:
    make = (
        'python3 -c "import os\nfor i in range('
        + str(files)
        + "):\n    open(f'f{i}.txt', 'wb').write(os.urandom(10240))\""
    )
    parent = [{"tool": "execute_bash", "arguments": {"command": make}}]
    parent += [
        {"tool": "execute_bash", "arguments": {"command": f"echo {i} > step{i}.txt"}}
        for i in range(2, steps + 1)
    ]
    parent += [
        {"tool": "finish", "arguments": {"message": "parent done"}},
        {"tool": "execute_bash", "arguments": {"command": FIRST}},  # each fork's first action
        {"tool": "finish", "arguments": {"message": "fork done"}},
    ]
    fresh = [
        {"tool": "execute_bash", "arguments": {"command": FIRST}},
        {"tool": "finish", "arguments": {"message": "fresh done"}},
    ]
    path.write_text(
        json.dumps(
            {
                "model": "scripted",
                "conversations": [
                    {"match": "bench-parent:", "turns": parent},
                    {"match": "bench-fresh:", "turns": fresh},
                ],
                "turns": [{"tool": "finish", "arguments": {"message": "?"}}],
            }
        )
    )
    return path


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _first_own(http: httpx.Client, task_id: str, deadline: float) -> tuple[float, float]:
    """(time of the task's first own action, time of its observation), from the log."""
    while time.monotonic() < deadline:
        events = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
        own = [e for e in events if not e.get("inherited_from")]
        action = next((e for e in own if e["kind"] == "run"), None)
        if action is not None:
            answer = next(
                (e for e in own if e["kind"] == "run_output" and e["cause"] == action["id"]),
                None,
            )
            if answer is not None:
                return _ts(action["timestamp"]), _ts(answer["timestamp"])
        time.sleep(0.1)
    view = http.get(f"/v1/tasks/{task_id}").json()
    raise TimeoutError(f"task {task_id}: no first action in time: {view['state']} {view['reason']}")


def _wait(http: httpx.Client, task_id: str, timeout_s: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view = http.get(f"/v1/tasks/{task_id}").json()
        if view["state"] in ("FINISHED", "ERROR", "STOPPED"):
            return dict(view)
        time.sleep(0.3)
    raise TimeoutError(task_id)


def _row(name: str, sent: float, firsts: list[tuple[float, float]]) -> dict[str, float]:
    actions = [a - sent for a, _ in firsts]
    answers = [o - sent for _, o in firsts]
    row = {
        "action_p50": statistics.median(actions),
        "action_max": max(actions),
        "observation_p50": statistics.median(answers),
        "observation_max": max(answers),
    }
    print(
        f"{name:<34} first action p50 {row['action_p50']:5.2f} s (max {row['action_max']:5.2f})"
        f"   its observation p50 {row['observation_p50']:5.2f} s (max "
        f"{row['observation_max']:5.2f})"
    )
    return row


def bench(stack: Stack, steps: int, forks: int) -> None:
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=60
    ) as http:
        parent = http.post("/v1/tasks", json={"task": "bench-parent: steps"}).json()["id"]
        view = _wait(http, parent)
        assert view["state"] == "FINISHED", view
        events = http.get(f"/v1/tasks/{parent}/events", params={"after": 0}).json()["events"]
        outputs = [e for e in events if e["kind"] == "run_output"]
        assert len(outputs) == steps, len(outputs)
        at = events[-1]["seq"]  # after its 20th step, as it finished
        deadline = time.monotonic() + 30
        while sum(e["kind"] == "workspace_checkpoint" for e in events) < steps:
            assert time.monotonic() < deadline, "the parent's checkpoints were not all logged"
            time.sleep(0.2)
            events = http.get(f"/v1/tasks/{parent}/events", params={"after": 0}).json()["events"]
        time.sleep(2)  # the pool back to its idle sandboxes, as for the baseline below

        # Baseline: as many new tasks posted at once, the same first command.
        sent = time.time()
        ids: list[str] = []
        lock = threading.Lock()

        def post() -> None:
            answer = http.post("/v1/tasks", json={"task": "bench-fresh: one command"})
            with lock:
                ids.append(answer.json()["id"])

        threads = [threading.Thread(target=post) for _ in range(forks)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        fresh = [_first_own(http, i, time.monotonic() + 300) for i in ids]
        for i in ids:
            _wait(http, i)
        time.sleep(5)  # the pool refills its idle sandboxes

        sent_fork = time.time()
        made = http.post(
            f"/v1/tasks/{parent}/fork", json={"at": at, "count": forks, "message": "go on"}
        )
        assert made.status_code == 202, made.text
        fork_ids = [f["id"] for f in made.json()["forks"]]
        forked = [_first_own(http, i, time.monotonic() + 300) for i in fork_ids]
        for i in fork_ids:
            view = _wait(http, i)
            assert view["state"] == "FINISHED", view
        print(f"parent: {steps} commands, fork at seq {at}; {forks} at once")
        _row(f"{forks} new tasks (baseline)", sent, fresh)
        _row(f"{forks} forks at step {steps}", sent_fork, forked)
        print("target: a fork's first action <= 2 s after the request, p50")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--forks", type=int, default=10)
    parser.add_argument("--files", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fork-bench-") as tmp:
        run_dir = Path(tmp)
        config = StackConfig.isolated(
            run_dir,
            llm_script=_script(run_dir / "script.json", args.steps, args.files),
            extra_env={"DECKHANDS_POOL_MIN_IDLE": "2"},
        )
        with running(config) as stack:
            bench(stack, args.steps, args.forks)


if __name__ == "__main__":
    main()
