"""A task's own /workspace quota (issue 10, part 3) reaches the runtime with every order, is in
the log's first entry (so a rebuilt State keeps it), and passes to its sub-tasks."""

from __future__ import annotations

from typing import Any

from loop_steps import TASK, executed, started  # type: ignore[import-not-found]

from services.controller.agent_loop import apply, created_entry
from services.controller.turn import Turn
from shared.commands import PrepareSandbox, StepRequest
from shared.events import (
    AgentDelegateAction,
    EventSource,
)
from shared.state import TaskState


def _started() -> tuple[TaskState, StepRequest, list[Any]]:
    return started(TaskState(task_id=TASK, task="do it", max_iterations=5, workspace_mib=512))


def test_the_orders_carry_the_tasks_workspace_quota() -> None:
    state, step, orders = _started()
    [prepare] = [o for o in orders if isinstance(o, PrepareSandbox)]
    assert prepare.workspace_mib == 512
    order = executed(state, step)
    assert order.workspace_mib == 512


def test_the_first_log_entry_keeps_it_and_a_sub_task_inherits_it() -> None:
    state, step, _ = _started()
    assert created_entry(state).workspace_mib == 512
    delegate = AgentDelegateAction(
        task_id=TASK, source=EventSource.AGENT, cause=step.id, task="sub"
    )
    turn = Turn(state)
    apply(turn, delegate)
    [child] = turn.new_tasks
    assert child.workspace_mib == 512
