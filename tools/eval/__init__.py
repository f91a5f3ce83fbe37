"""The evaluation harness (issue 16): a task set with automatic checks, run through a stack's
gateway and scored in fresh sandbox containers. `python -m tools.eval` / `make eval`."""

from .runner import EvalReport, TaskOutcome, run_eval
from .tasks import HEADLINE, TASKS, EvalTask, select

__all__ = ["HEADLINE", "TASKS", "EvalReport", "EvalTask", "TaskOutcome", "run_eval", "select"]
