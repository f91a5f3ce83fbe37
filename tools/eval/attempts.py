"""`make eval --attempts k` (issue 28): each task's set-up runs once, then k forks of it attempt
the task, each scored on its own; the report gives pass@1 (the share of attempts that pass) and
pass@k (the share of tasks with an attempt that passes).

The set-up is a task of its own on the task's starting files: the runtime checks the repository
out before its first action, the agent lists the files and finishes, and the runtime's
checkpoint after that action holds them. Its forks (POST /v1/tasks/{id}/fork at its last seq,
`count` k, the task's prompt as their message) each start from that checkpoint in a sandbox of
their own: the checkout and the first look are done once, not k times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .repos import RepoServer
from .runner import Cancelled, Gateway, TaskOutcome, follow_and_score, wait_for_end
from .scorer import Scorer
from .tasks import EvalTask

__all__ = ["SETUP_ITERATIONS", "run_attempts", "setup_prompt"]

SETUP_ITERATIONS = 3  # list the files, finish; one spare for a model that looks twice


def setup_prompt(task: EvalTask) -> str:
    """The set-up task's text: look, do nothing else (the task comes as the forks' message)."""
    return (
        f"Set-up for evaluation task {task.id}: run `ls -la` in /workspace once, then finish "
        "at once. Do not change any file; the task itself comes in the next message."
    )


def run_attempts(
    gateway: Gateway,
    repos: RepoServer,
    scorer: Scorer,
    task: EvalTask,
    attempts: int,
    timeout_s: float,
    on_state: Callable[[str], None],
    cancel: threading.Event,
) -> list[TaskOutcome]:
    """`attempts` outcomes of `task`, from one set-up and its forks."""
    started = time.monotonic()
    body: dict[str, Any] = {
        "task": setup_prompt(task),
        "max_iterations": SETUP_ITERATIONS,
        "labels": ["eval", f"eval:{task.id}", "eval:setup"],
        "priority": "batch",
    }
    url = repos.url(task)
    if url is not None:
        body["repository"] = {"url": url, "ref": "main"}

    def failed(why: str) -> list[TaskOutcome]:
        return [
            TaskOutcome(id=task.id, kind=task.kind, split=task.split, attempt=i + 1, error=why)
            for i in range(attempts)
        ]

    created = gateway.call("POST", "/v1/tasks", json=body)
    if created.status_code != 202:
        return failed(f"set-up: {created.status_code} {created.text[:300]}")
    setup_id = created.json()["id"]
    on_state("set-up")
    view, _ = wait_for_end(gateway, setup_id, timeout_s, cancel)
    if view.get("state") != "FINISHED":
        return failed(f"set-up ended {view.get('state')}: {view.get('reason', '')[:200]}")
    page = gateway.call("GET", f"/v1/tasks/{setup_id}/events", params={"after": 0}).json()
    at = int(page["last_seq"])
    forked = gateway.call(
        "POST",
        f"/v1/tasks/{setup_id}/fork",
        json={
            "at": at,
            "count": attempts,
            "message": task.prompt,
            "labels": ["eval", f"eval:{task.id}", "eval:attempt"],
            # The set-up's iterations are in the forks' history: the task keeps its own.
            "limits": {"max_iterations": task.max_iterations + int(view.get("iterations", 0))},
        },
    )
    if forked.status_code != 202:
        return failed(f"fork: {forked.status_code} {forked.text[:300]}")
    forks = [f["id"] for f in forked.json()["forks"]]

    def attempt(i: int) -> TaskOutcome:
        outcome = TaskOutcome(id=task.id, kind=task.kind, split=task.split, attempt=i + 1)
        try:
            return follow_and_score(
                gateway, scorer, task, forks[i], outcome, timeout_s, on_state, cancel, started
            )
        except Cancelled:
            raise
        except Exception as exc:  # one attempt's failure is its own
            outcome.error = f"{type(exc).__name__}: {exc}"
            return outcome

    with ThreadPoolExecutor(max_workers=attempts) as pool:
        return list(pool.map(attempt, range(attempts)))
