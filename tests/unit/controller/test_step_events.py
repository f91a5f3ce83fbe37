"""A step request carries the log entries the reasoner has not seen (pure logic, no I/O)."""

from __future__ import annotations

from loop_steps import TASK, apply_event, run_once  # type: ignore[import-not-found]

from services.controller.turn import UNSEEN_MAX_BYTES, Turn
from shared.commands import StepRequest
from shared.events import (
    MessageAction,
)
from shared.state import TaskState


def _step_of(turn: Turn) -> StepRequest:
    steps = [m for _, m in turn.sent if isinstance(m, StepRequest)]
    assert len(steps) == 1
    return steps[0]


def _one_step(state: TaskState, output: str) -> tuple[Turn, TaskState]:
    """The agent's command, its review and its output: the turn that asks for the next step."""
    assert state.awaiting_id is not None
    turn = run_once(state, state.awaiting_id, "ls", output)
    return turn, turn.state


def test_each_step_carries_the_entries_logged_since_the_previous_one() -> None:
    start = TaskState(task_id=TASK, task="do it", max_iterations=5)
    first = apply_event(start, MessageAction(task_id=TASK, source="USER", content="do it"))
    step = _step_of(first)
    assert [e["seq"] for e in step.events] == list(range(1, step.after_seq + 1))
    assert step.events[0]["kind"] == "task_created"
    assert step.events[1]["kind"] == "message" and step.events[1]["content"] == "do it"
    assert first.state.unseen_events == [] and first.state.unseen_bytes == 0

    turn, state = _one_step(first.state, "a.txt\n")
    second = _step_of(turn)
    assert [e["seq"] for e in second.events] == list(
        range(step.after_seq + 1, second.after_seq + 1)
    )
    assert [e["kind"] for e in second.events] == ["run", "security_verdict", "run_output"]
    assert state.unseen_events == []
    # What the step carries is what the log gets, byte for byte.
    logged = {o.msg_id: o.payload for o in turn.outbox()}
    assert second.events[-1]["id"] in logged


def test_entries_too_large_to_carry_are_left_to_storage_then_carrying_resumes() -> None:
    start = TaskState(task_id=TASK, task="do it", max_iterations=5)
    state = apply_event(start, MessageAction(task_id=TASK, source="USER", content="do it")).state
    turn, state = _one_step(state, "x" * (UNSEEN_MAX_BYTES + 1))
    assert _step_of(turn).events == []  # the reasoner reads these from storage
    assert state.unseen_events == [] and state.unseen_bytes == 0
    turn, state = _one_step(state, "small\n")
    assert [e["kind"] for e in _step_of(turn).events] == ["run", "security_verdict", "run_output"]
