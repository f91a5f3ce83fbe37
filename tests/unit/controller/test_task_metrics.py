"""services.controller.metrics: a task's end is counted once, by its end state, with the
time from its creation; other changes count nothing."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import REGISTRY

from services.controller.metrics import count_task_end
from shared.events import AgentState
from shared.state import TaskState


def _ended(state: str) -> float:
    value = REGISTRY.get_sample_value("deckhands_controller_tasks_ended_total", {"state": state})
    return value or 0.0


def _durations(state: str) -> tuple[float, float]:
    labels = {"state": state}
    count = REGISTRY.get_sample_value("deckhands_controller_task_duration_seconds_count", labels)
    total = REGISTRY.get_sample_value("deckhands_controller_task_duration_seconds_sum", labels)
    return count or 0.0, total or 0.0


def test_every_end_state_is_exported_at_zero_before_any_task_ends() -> None:
    for state in ("FINISHED", "STOPPED", "REJECTED", "ERROR"):
        sample = REGISTRY.get_sample_value(
            "deckhands_controller_tasks_ended_total", {"state": state}
        )
        assert sample is not None


def test_a_task_reaching_an_end_state_counts_once_with_its_duration() -> None:
    running = TaskState(task_id="t", task="do it", max_iterations=5).model_copy(
        update={"agent_state": AgentState.RUNNING}
    )
    finished = running.model_copy(
        update={
            "agent_state": AgentState.FINISHED,
            "finished_at": running.created_at + timedelta(seconds=42),
        }
    )
    ended, (count, total) = _ended("FINISHED"), _durations("FINISHED")
    count_task_end(running, finished)
    assert _ended("FINISHED") == ended + 1
    assert _durations("FINISHED") == (count + 1, total + 42)
    # A later turn of the finished task, or a change between live states, counts nothing.
    count_task_end(finished, finished)
    paused = running.model_copy(update={"agent_state": AgentState.PAUSED})
    count_task_end(running, paused)
    assert _ended("FINISHED") == ended + 1 and _ended("PAUSED") == 0
