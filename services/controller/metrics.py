"""The controller's Prometheus metrics (served on /metrics when DECKHANDS_METRICS_PORT is set)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from shared.events import TERMINAL_STATES
from shared.state import TaskState

__all__ = [
    "CONFLICTS",
    "DELEGATIONS_REFUSED",
    "OVERDUE",
    "QUEUED",
    "REBUILT",
    "REPLAYED",
    "RE_REQUESTS",
    "STALE",
    "STEPS",
    "STUCK",
    "TASKS_ENDED",
    "TASK_DURATION",
    "TURN_SECONDS",
    "count_task_end",
]

# --- what the turns decide (agent_loop.py) ----------------------------------------------------

STALE = Counter(
    "deckhands_controller_stale_answers_total",
    "Answers that arrived after the task stopped waiting for them",
    ["kind"],
)
STEPS = Counter("deckhands_controller_steps_total", "Step requests sent to the reasoner")
QUEUED = Counter(
    "deckhands_controller_actions_queued_total", "Actions that waited for a sandbox seat"
)
RE_REQUESTS = Counter(
    "deckhands_controller_re_requests_total",
    "Orders sent again because their answer was overdue",
    ["awaiting"],
)
STUCK = Counter("deckhands_controller_stuck_total", "Tasks ended by the stuck detector")
DELEGATIONS_REFUSED = Counter(
    "deckhands_controller_delegations_refused_total",
    "Delegations refused: past the depth or fan-out limit, or the parent's iterations or budget",
)

# --- how many tasks reach an end state, and how long they took to get there --------------------
# These feed the dashboard's "tasks finished/failed per minute" and "task duration" panels and
# the "no task finishing" alert (deploy/). The only label is the end state: never a task id.

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


# --- loading, applying and saving each input (handlers.py) -------------------------------------

CONFLICTS = Counter("deckhands_controller_cas_conflicts_total", "State writes lost to a replica")
REPLAYED = Counter(
    "deckhands_controller_redelivered_inputs_total", "Inputs recognised as already applied"
)
TURN_SECONDS = Histogram("deckhands_controller_turn_seconds", "Time to apply one input event")
OVERDUE = Counter(
    "deckhands_controller_overdue_answers_total", "Awaited answers found past their deadline"
)
REBUILT = Counter(
    "deckhands_controller_states_rebuilt_total",
    "Task States rebuilt from the event log because Redis had lost them",
)
