"""Driving the controller's pure loop in unit tests: one input applied, one agent step run."""

from __future__ import annotations

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from shared.commands import StepRequest
from shared.events import (
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import TaskState

__all__ = ["TASK", "apply_event", "run_once"]

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
