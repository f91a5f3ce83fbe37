"""The evaluation's task set: small, self-contained coding tasks, each with an automatic check
(what a task holds: task.py).

The set has two halves (`EvalTask.split`): the development half (tasks_dev.py: the tasks the
agent's prompts and tools were tuned on) and the held-out half (tasks_heldout.py: tasks they are
not tuned on, whose pass rate says how the agent does on work nobody shaped it for). Every kind
of task is in both. `HEADLINE` is the fixed subset of 10 (all in the development half) whose
pass rate is the headline figure.
"""

from __future__ import annotations

from .task import KINDS, SPLITS, EvalTask
from .tasks_dev import DEV
from .tasks_heldout import HELDOUT

__all__ = ["HEADLINE", "KINDS", "SPLITS", "SUBSETS", "TASKS", "EvalTask", "select"]

TASKS: tuple[EvalTask, ...] = DEV + HELDOUT

HEADLINE: tuple[str, ...] = (
    "squares",
    "fib",
    "fix-calc",
    "unittest-slugify",
    "three-lines",
    "edit-port",
    "count-log-lines",
    "csv-total",
    "rename-function",
    "json-names",
)

SUBSETS = ("headline", "dev", "heldout", "all")


def select(subset: str, only: list[str] | None = None) -> list[EvalTask]:
    """The tasks of `subset` ("headline", "dev", "heldout" or "all": both halves), or those
    named in `only` (ValueError names an unknown one)."""
    by_id = {task.id: task for task in TASKS}
    if only:
        unknown = [name for name in only if name not in by_id]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; known: {sorted(by_id)}")
        return [by_id[name] for name in only]
    if subset == "headline":
        return [by_id[name] for name in HEADLINE]
    if subset in SPLITS:
        return [task for task in TASKS if task.split == subset]
    if subset == "all":
        return list(TASKS)
    raise ValueError(f"subset {subset!r}: use one of {', '.join(SUBSETS)}")
