"""How many tasks reach an end state, and how long they took to get there.

These feed the dashboard's "tasks finished/failed per minute" and "task duration" panels and the
"no task finishing" alert (deploy/). The only label is the end state: never a task id.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from shared.events import TERMINAL_STATES
from shared.state import TaskState

__all__ = ["TASKS_ENDED", "TASK_DURATION", "count_task_end"]

TASKS_ENDED = Counter(
    "deckhands_controller_tasks_ended_total",
    "Tasks that reached an end state (FINISHED, STOPPED, REJECTED or ERROR), by that state",
    ["state"],
)
# Agent tasks run from seconds to hours.
TASK_DURATION = Histogram(
    "deckhands_controller_task_duration_seconds",
    "From a task's creation to its end state (a resumed task: to its latest end)",
    ["state"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400),
)

# Every state's series exists from the start at 0: Prometheus' increase() misses the first end
# of a series that appears with it, and "no task ended" must read 0, not nothing.
for _state in TERMINAL_STATES:
    TASKS_ENDED.labels(_state.value)
    TASK_DURATION.labels(_state.value)


def count_task_end(before: TaskState, after: TaskState) -> None:
    """Count a turn that took the task into an end state. Called only once the turn's State is
    saved: a turn lost to a compare-and-set conflict is decided again and must count once."""
    state = after.agent_state
    if state == before.agent_state or state not in TERMINAL_STATES:
        return
    TASKS_ENDED.labels(state.value).inc()
    if after.finished_at is not None:
        duration = (after.finished_at - after.created_at).total_seconds()
        TASK_DURATION.labels(state.value).observe(max(0.0, duration))
