"""Post the tasks through a gateway, several at once, follow each to its end, score it, report.

Each task is created with its starting files as a repository (repos.py), followed by polling GET
/v1/tasks/{id} until it ends. A task that waits for a person (a question, a confirmation) or
outlives its deadline is stopped: nobody answers in an evaluation. Its workspace is then
downloaded (an ended task's sandbox is kept stopped for DECKHANDS_WORKSPACE_RETENTION_S) and its
check run (scorer.py).
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from .repos import RepoServer, serve_repositories
from .scorer import Scorer
from .tasks import EvalTask

__all__ = [
    "Cancelled",
    "EvalReport",
    "Gateway",
    "TaskOutcome",
    "follow_and_score",
    "run_eval",
    "wait_for_end",
]

_TRANSCRIPT_CHARS = 30_000
# Bookkeeping a reader of the transcript does not need.
_QUIET_KINDS = {"security_verdict", "sandbox_queued", "condensation"}
_ENDED = {"FINISHED", "STOPPED", "REJECTED", "ERROR"}
_WAITING = {"AWAITING_USER_INPUT", "AWAITING_USER_CONFIRMATION", "PAUSED"}


@dataclass
class TaskOutcome:
    id: str
    kind: str
    split: str = ""  # the task's half of the set: "dev" or "heldout"
    attempt: int = 1  # with --attempts k: which of the task's k attempts (1..k)
    passed: bool = False
    state: str = ""
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    task_id: str = ""
    final_message: str = ""
    check_exit: int | None = None
    check_output: str = ""
    error: str = ""
    # What happened, as `deckhands logs` shows it (plain text, bounded): each command with its
    # output, file edits as diffs, the final message.
    transcript: str = ""


@dataclass
class EvalReport:
    model: str
    subset: str
    concurrency: int
    started_at: str
    seconds: float = 0.0
    attempts: int = 1  # attempts per task (forks of one set-up when more than 1)
    outcomes: list[TaskOutcome] = field(default_factory=list)

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def pass_rate(self) -> float:
        """pass@1: the share of attempts that pass."""
        return self.passed / len(self.outcomes) if self.outcomes else 0.0

    @property
    def tasks(self) -> int:
        return len({o.id for o in self.outcomes})

    @property
    def pass_at_k(self) -> float:
        """The share of tasks with at least one attempt that passes."""
        solved = {o.id for o in self.outcomes if o.passed}
        return len(solved) / self.tasks if self.outcomes else 0.0

    @property
    def splits(self) -> dict[str, EvalReport]:
        """A report of each half of the set present in the run (dev, then heldout)."""
        names = sorted({o.split for o in self.outcomes if o.split}, key=lambda s: (s != "dev", s))
        return {
            name: replace(self, outcomes=[o for o in self.outcomes if o.split == name])
            for name in names
        }

    @property
    def failed_iterations(self) -> int:
        """The iterations (steps) spent on the attempts that failed, all together."""
        return sum(o.steps for o in self.outcomes if not o.passed)

    @property
    def failed_iterations_mean(self) -> float:
        failed = len(self.outcomes) - self.passed
        return self.failed_iterations / failed if failed else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "subset": self.subset,
            "concurrency": self.concurrency,
            "started_at": self.started_at,
            "seconds": round(self.seconds, 1),
            "passed": self.passed,
            "total": len(self.outcomes),
            "pass_rate": round(self.pass_rate, 3),
            "attempts": self.attempts,
            "pass_at_1": round(self.pass_rate, 3),
            "pass_at_k": round(self.pass_at_k, 3),
            # Each half present: {passed, total, pass_rate, pass_at_k}.
            "splits": {
                name: {
                    "passed": part.passed,
                    "total": len(part.outcomes),
                    "pass_rate": round(part.pass_rate, 3),
                    "pass_at_k": round(part.pass_at_k, 3),
                }
                for name, part in self.splits.items()
            },
            "failed": len(self.outcomes) - self.passed,
            "failed_iterations": self.failed_iterations,
            "failed_iterations_mean": round(self.failed_iterations_mean, 1),
            "tasks": [asdict(o) for o in self.outcomes],
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


def describe_model() -> str:
    """Which LLM the stack's agent runs on, as the stack chooses it (tools.stack._env)."""
    model = os.environ.get("DECKHANDS_LLM_MODEL")
    if model:
        return model
    if os.environ.get("DECKHANDS_STACK_LLM", "local") == "scripted":
        return "scripted"
    return "local (Qwen2.5-Coder-1.5B, llama.cpp)"


class Cancelled(Exception):
    """The run was interrupted: the task was stopped and is not scored."""


class Gateway:
    def __init__(self, url: str, api_key: str) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60.0
        )

    def call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request, retried on a transport error or 503 for about 30 s."""
        last = ""
        for _ in range(30):
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                last = repr(exc)
            else:
                if response.status_code != 503:
                    return response
                last = f"503 {response.text[:200]}"
            time.sleep(1.0)
        raise RuntimeError(f"{method} {path}: no answer ({last})")


def _run_one(
    gateway: Gateway,
    repos: RepoServer,
    scorer: Scorer,
    task: EvalTask,
    timeout_s: float,
    on_state: Callable[[str], None],
    cancel: threading.Event,
) -> TaskOutcome:
    outcome = TaskOutcome(id=task.id, kind=task.kind, split=task.split)
    started = time.monotonic()
    body: dict[str, Any] = {
        "task": task.prompt,
        "max_iterations": task.max_iterations,
        "labels": ["eval", f"eval:{task.id}"],
        # An evaluation is batch work: a person's interactive task of the tenant goes first.
        "priority": "batch",
    }
    url = repos.url(task)
    if url is not None:
        body["repository"] = {"url": url, "ref": "main"}
    created = gateway.call("POST", "/v1/tasks", json=body)
    if created.status_code != 202:
        outcome.error = f"create: {created.status_code} {created.text[:300]}"
        return outcome
    return follow_and_score(
        gateway, scorer, task, created.json()["id"], outcome, timeout_s, on_state, cancel, started
    )


def follow_and_score(
    gateway: Gateway,
    scorer: Scorer,
    task: EvalTask,
    task_id: str,
    outcome: TaskOutcome,
    timeout_s: float,
    on_state: Callable[[str], None],
    cancel: threading.Event,
    started: float,
) -> TaskOutcome:
    """Follow the stack's task `task_id` (an attempt at `task`) to its end, then score it."""
    outcome.task_id = task_id
    view, outcome.error = wait_for_end(gateway, task_id, timeout_s, cancel, on_state, started)
    outcome.seconds = round(time.monotonic() - started, 1)
    outcome.state = view.get("state", "")
    outcome.steps = int(view.get("iterations", 0))
    outcome.tokens = int((view.get("usage") or {}).get("total_tokens", 0))
    outcome.final_message = ((view.get("result") or {}).get("final_message")) or ""
    if outcome.state == "ERROR":
        # ERROR ends the run, not the task: its sandbox lives on until it is stopped.
        outcome.error = outcome.error or f"error: {view.get('reason', '')[:300]}"
    on_state("checking")
    try:
        outcome.transcript = _transcript(gateway, task_id)
    except Exception as exc:  # a transcript is for reading; its loss is no failure
        outcome.transcript = f"(no transcript: {exc})"
    workspace = gateway.call("GET", f"/v1/tasks/{task_id}/workspace")
    if outcome.state == "ERROR":
        gateway.call("POST", f"/v1/tasks/{task_id}/stop")
    if workspace.status_code != 200:
        outcome.error = (
            outcome.error + "; " if outcome.error else ""
        ) + f"workspace: {workspace.status_code} {workspace.text[:200]}"
        tgz = None
    else:
        tgz = workspace.content
    result = scorer.check(task, tgz, outcome.final_message)
    outcome.passed = result.passed
    outcome.check_exit = result.exit_code
    outcome.check_output = result.output
    return outcome


def wait_for_end(
    gateway: Gateway,
    task_id: str,
    timeout_s: float,
    cancel: threading.Event,
    on_state: Callable[[str], None] = lambda _state: None,
    started: float | None = None,
) -> tuple[dict[str, Any], str]:
    """The task's view once it ended, and why it was stopped if it was: a task that waits for
    a person (nobody answers in an evaluation) or runs past `timeout_s` is stopped."""
    started = time.monotonic() if started is None else started
    view: dict[str, Any] = {}
    note = ""
    stopped = False
    if cancel.is_set():
        gateway.call("POST", f"/v1/tasks/{task_id}/stop")
        raise Cancelled
    while True:
        answer = gateway.call("GET", f"/v1/tasks/{task_id}")
        if answer.status_code == 200:
            view = answer.json()
            on_state(view["state"])
            state = view["state"]
            if state in _ENDED:
                return view, note
            if not stopped and (state in _WAITING or time.monotonic() - started > timeout_s):
                why = "waits for a person" if state in _WAITING else f"ran past {timeout_s:g}s"
                note = f"stopped: {why} ({state})"
                gateway.call("POST", f"/v1/tasks/{task_id}/stop")
                stopped = True
        if time.monotonic() - started > timeout_s + 120:
            return view, note or "did not end"
        if cancel.wait(1.0):
            gateway.call("POST", f"/v1/tasks/{task_id}/stop")
            raise Cancelled


def _transcript(gateway: Gateway, task_id: str) -> str:
    """The task's events rendered as the deckhands command renders them, as plain text."""
    from rich.console import Console

    from ..cli.render import event_renderable

    text = io.StringIO()
    console = Console(file=text, width=100, color_system=None, force_terminal=False)
    after = 0
    for _ in range(100):
        page = gateway.call("GET", f"/v1/tasks/{task_id}/events", params={"after": after})
        if page.status_code != 200:
            console.print(f"(events: {page.status_code})")
            break
        body = page.json()
        for event in body["events"]:
            if event.get("kind") not in _QUIET_KINDS:
                console.print(event_renderable(event))
        if not body.get("has_more"):
            break
        after = body["next_after"]
    out = text.getvalue()
    if len(out) > _TRANSCRIPT_CHARS:
        half = _TRANSCRIPT_CHARS // 2
        out = f"{out[:half]}\n[... {len(out) - 2 * half} characters cut ...]\n{out[-half:]}"
    return out


def run_eval(
    url: str,
    api_key: str,
    tasks: list[EvalTask],
    *,
    subset: str = "custom",
    concurrency: int = 2,
    timeout_s: float = 900.0,
    on_progress: Callable[[str, str], None] | None = None,
    attempts: int = 1,
) -> EvalReport:
    """Run `tasks` on the stack at `url`, at most `concurrency` at once. `on_progress(task,
    what)` hears each state a task goes through, then "passed" or "failed"."""
    report = EvalReport(
        model=describe_model(),
        subset=subset,
        concurrency=concurrency,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        attempts=attempts,
    )
    started = time.monotonic()
    gateway = Gateway(url, api_key)
    scorer = Scorer()
    lock = threading.Lock()
    cancel = threading.Event()
    notify = on_progress or (lambda _task, _what: None)

    def one(task: EvalTask) -> list[TaskOutcome]:
        heard = lambda s: notify(task.id, s)  # noqa: E731
        try:
            if attempts > 1:
                from .attempts import run_attempts

                outcomes = run_attempts(
                    gateway, repos, scorer, task, attempts, timeout_s, heard, cancel
                )
            else:
                outcomes = [_run_one(gateway, repos, scorer, task, timeout_s, heard, cancel)]
        except Cancelled:
            raise
        except Exception as exc:  # one task's failure is its own, not the run's
            why = f"{type(exc).__name__}: {exc}"
            outcomes = [TaskOutcome(id=task.id, kind=task.kind, split=task.split, error=why)]
        with lock:
            notify(task.id, "passed" if any(o.passed for o in outcomes) else "failed")
        return outcomes

    try:
        with serve_repositories(tasks) as repos:
            pool = ThreadPoolExecutor(max_workers=max(1, concurrency))
            try:
                report.outcomes = [o for found in pool.map(one, tasks) for o in found]
            except BaseException:
                # Ctrl-C (or a bug): each running task is stopped on the stack, none is scored.
                cancel.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
    finally:
        scorer.close()
        gateway.http.close()
    report.seconds = time.monotonic() - started
    return report
