"""A task's own /workspace quota (issue 10, part 3) reaches the runtime with every order, is in
the log's first entry (so a rebuilt State keeps it), and passes to its sub-tasks."""

from __future__ import annotations

from typing import Any

from services.controller.agent_loop import apply, created_entry
from services.controller.turn import Turn
from services.security.handlers import reviewed
from shared.commands import ExecuteAction, PrepareSandbox, ReviewAction, StepRequest
from shared.events import (
    AgentDelegateAction,
    CmdRunAction,
    EventSource,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import TaskState

TASK = "t1"


def _started() -> tuple[TaskState, StepRequest, list[Any]]:
    turn = Turn(TaskState(task_id=TASK, task="do it", max_iterations=5, workspace_mib=512))
    apply(turn, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    orders = [order for _, order in turn.sent]
    step = next(o for o in orders if isinstance(o, StepRequest))
    return turn.state, step, orders


def test_the_orders_carry_the_tasks_workspace_quota() -> None:
    state, step, orders = _started()
    [prepare] = [o for o in orders if isinstance(o, PrepareSandbox)]
    assert prepare.workspace_mib == 512
    action = CmdRunAction(task_id=TASK, source=EventSource.AGENT, cause=step.id, command="ls")
    ruling = SecurityVerdictObservation(
        id=f"verdict-{action.id}",
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    turn = Turn(state)
    apply(
        turn, reviewed(ReviewAction(id=f"review-{action.id}", task_id=TASK, action=action), ruling)
    )
    [order] = [o for _, o in turn.sent if isinstance(o, ExecuteAction)]
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
