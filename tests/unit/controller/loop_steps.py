"""Driving the controller's pure loop in unit tests: a task started, one input applied, one
agent step run, one reviewed action's order."""

from __future__ import annotations

from typing import Any

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from services.security.handlers import reviewed
from shared.commands import ExecuteAction, ReviewAction, StepRequest
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    EventSource,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import TaskState

__all__ = ["TASK", "apply_event", "executed", "run_once", "started"]

TASK = "t1"


def apply_event(state: TaskState, event: EventBase) -> Turn:
    turn = Turn(state)
    apply(turn, event)
    return turn


def run_once(state: TaskState, step: StepRequest | str, command: str, output: str) -> Turn:
    """The agent's command for `step` (or a step id), allowed, and its output: the turn that
    applies the output (and asks for the next step)."""
    step_id = step if isinstance(step, str) else step.id
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step_id, command=command)
    state = apply_event(state, action).state
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    state = apply_event(state, verdict).state
    obs = CmdOutputObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        command=command,
        content=output,
        exit_code=0,
        cwd="/workspace",
    )
    return apply_event(state, obs)


def started(state: TaskState) -> tuple[TaskState, StepRequest, list[Any]]:
    """The task's first message applied: its State, the step asked for, and every order sent."""
    turn = Turn(state)
    apply(turn, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    orders = [order for _, order in turn.sent]
    step = next(o for o in orders if isinstance(o, StepRequest))
    return turn.state, step, orders


def executed(state: TaskState, step: StepRequest) -> ExecuteAction:
    """The order that runs the agent's command for `step`, once the monitor allowed it."""
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
    return order
