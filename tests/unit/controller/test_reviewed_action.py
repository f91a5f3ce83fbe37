"""A runnable action reviewed on its way from the reasoner: the controller's one turn for it."""

from __future__ import annotations

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from services.security.handlers import reviewed, verdict_for
from shared.commands import ExecuteAction, ReviewAction, StepRequest
from shared.events import (
    AgentState,
    CmdRunAction,
    ErrorObservation,
    MessageAction,
    ReviewedAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import Awaiting, TaskState
from shared.subjects import Service

TASK = "t1"


def _turn(state: TaskState, event: object) -> Turn:
    turn = Turn(state)
    apply(turn, event)  # type: ignore[arg-type]
    return turn


def _started(**kw: object) -> tuple[TaskState, StepRequest]:
    state = TaskState(task_id=TASK, task="do it", max_iterations=5, **kw)  # type: ignore[arg-type]
    turn = _turn(state, MessageAction(task_id=TASK, source="USER", content="do it"))
    step = turn.sent[-1][1]
    assert isinstance(step, StepRequest)
    return turn.state, step


def _reviewed(action: CmdRunAction, verdict: Verdict, risk: RiskLevel) -> ReviewedAction:
    request = ReviewAction(id=f"review-{action.id}", task_id=TASK, action=action)
    ruling = SecurityVerdictObservation(
        id=f"verdict-{action.id}",
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=verdict,
        risk=risk,
    )
    return reviewed(request, ruling)


def test_an_allowed_action_is_logged_with_its_verdict_and_run_in_one_turn() -> None:
    state, step = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    turn = _turn(state, _reviewed(action, Verdict.ALLOW, RiskLevel.LOW))
    assert [e.kind for e in turn.logged] == ["run", "security_verdict"]  # type: ignore[attr-defined]
    assert turn.logged[0].id == action.id and turn.logged[1].cause == action.id
    [(service, order)] = turn.sent
    assert service is Service.RUNTIME and isinstance(order, ExecuteAction)
    assert order.action.id == action.id
    assert (turn.state.awaiting, turn.state.awaiting_id) == (Awaiting.RUNTIME, action.id)
    assert turn.state.approval is not None and turn.state.approval.action_id == action.id


def test_a_denied_action_is_logged_refused_and_the_agent_asked_again() -> None:
    state, step = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="rm -rf /")
    turn = _turn(state, _reviewed(action, Verdict.DENY, RiskLevel.HIGH))
    kinds = [e.kind for e in turn.logged]  # type: ignore[attr-defined]
    assert kinds == ["run", "security_verdict", "error"]
    assert isinstance(turn.logged[2], ErrorObservation)
    [(service, order)] = turn.sent
    assert service is Service.REASONER and isinstance(order, StepRequest)


def test_a_risky_action_waits_for_confirmation() -> None:
    state, step = _started(confirmation_mode=True, confirmation_threshold=RiskLevel.MEDIUM)
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="pip install x")
    turn = _turn(state, _reviewed(action, Verdict.ALLOW, RiskLevel.MEDIUM))
    assert turn.state.agent_state is AgentState.AWAITING_USER_CONFIRMATION
    assert turn.state.awaiting is Awaiting.CONFIRMATION and turn.sent == []


def test_a_review_the_controller_asked_for_again_answers_with_its_verdict_only() -> None:
    state, step = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    waiting = _turn(state, action)  # the action came straight: the controller asked for a review
    assert waiting.state.awaiting is Awaiting.SECURITY
    turn = _turn(waiting.state, _reviewed(action, Verdict.ALLOW, RiskLevel.LOW))
    assert [e.kind for e in turn.logged] == ["security_verdict"]  # type: ignore[attr-defined]
    assert turn.state.awaiting is Awaiting.RUNTIME


def test_a_late_or_mismatched_review_changes_nothing() -> None:
    state, step = _started()
    stale = CmdRunAction(task_id=TASK, source="AGENT", cause="an-older-step", command="ls")
    turn = _turn(state, _reviewed(stale, Verdict.ALLOW, RiskLevel.LOW))
    assert turn.logged == [] and turn.sent == [] and turn.state.awaiting is Awaiting.AGENT

    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    other = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="id")
    mixed = _reviewed(action, Verdict.ALLOW, RiskLevel.LOW).model_copy(
        update={"verdict": _reviewed(other, Verdict.ALLOW, RiskLevel.LOW).verdict}
    )
    turn = _turn(state, mixed)
    assert turn.logged == [] and turn.sent == [] and turn.state.awaiting is Awaiting.AGENT


def test_the_monitor_answers_with_the_action_and_a_verdict_on_it() -> None:
    action = CmdRunAction(task_id=TASK, source="AGENT", cause="s1", command="ls")
    request = ReviewAction(id="r1", task_id=TASK, action=action)
    answer = reviewed(request, verdict_for(request, "/workspace"))
    assert answer.action == action and answer.verdict.cause == action.id
    assert answer.cause == "s1"
    # A redelivered review sends the same message (JetStream stores it once).
    assert reviewed(request, verdict_for(request, "/workspace")).id == answer.id
