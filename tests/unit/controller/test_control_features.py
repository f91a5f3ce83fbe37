"""Stuck detection, limits raised on resume, confirmation mode and delegation."""

from __future__ import annotations

from loop_steps import TASK, apply_event, run_once  # type: ignore[import-not-found]

from services.controller.agent_loop import sub_task_id
from services.controller.stuck import detect
from shared.commands import ExecuteAction, StepRequest
from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentState,
    ChangeAgentStateAction,
    CmdRunAction,
    ErrorObservation,
    LLMUsage,
    LoopHintObservation,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    UserRejectObservation,
    Verdict,
)
from shared.state import Awaiting, TaskState
from shared.subjects import Service

_apply = apply_event
_run_once = run_once


def _started(**fields: object) -> tuple[TaskState, StepRequest]:
    state = TaskState(task_id=TASK, task="x", max_iterations=20, **fields)  # type: ignore[arg-type]
    turn = _apply(state, MessageAction(task_id=TASK, source="USER", content="x"))
    step = turn.sent[-1][1]
    assert isinstance(step, StepRequest)
    return turn.state, step


def test_four_identical_steps_get_a_hint_then_four_more_end_in_error() -> None:
    state, step = _started()
    hints = []
    for i in range(8):
        turn = _run_once(state, step, "ls", "same output")
        state = turn.state
        hints += [e for e in turn.logged if isinstance(e, LoopHintObservation)]
        if i < 7:
            assert state.agent_state is AgentState.RUNNING, (i, state.reason)
            step = turn.sent[-1][1]  # type: ignore[assignment]
            assert isinstance(step, StepRequest)
        if i == 3:  # the fourth: the agent is told, and goes on
            assert len(hints) == 1 and "same result each time" in hints[0].hint
    assert state.agent_state is AgentState.ERROR and len(hints) == 1
    assert "stuck in a loop: repeating action/observation" in state.reason


def test_different_steps_are_not_stuck() -> None:
    state, step = _started()
    for i in range(5):
        turn = _run_once(state, step, f"echo {i}", str(i))
        state, step = turn.state, turn.sent[-1][1]  # type: ignore[assignment]
    assert state.agent_state is AgentState.RUNNING


def test_stuck_patterns() -> None:
    assert detect(["A:1", "E:1", "A:1", "E:1", "A:1", "E:1"]) is not None
    assert "monologue" in (detect(["O:1", "M:2", "M:2", "M:2"]) or "")
    alternating = ["A:a", "O:a", "A:b", "O:b"] * 3
    assert "alternating" in (detect(alternating) or "")
    assert "condensation" in (detect(["C:"] * 10) or "")
    assert detect(["A:1", "O:1", "A:2", "O:2"]) is None


def test_budget_limit_stops_and_a_user_message_raises_it() -> None:
    state, step = _started(max_budget_usd=0.01, initial_budget_usd=0.01)
    think = MessageAction(
        task_id=TASK,
        source="AGENT",
        cause=step.id,
        content="thinking",
        llm_usage=LLMUsage(model="m", cost_usd=0.02),
    )
    state = _apply(state, think).state
    assert state.agent_state is AgentState.ERROR
    assert "maximum budget" in state.reason
    resumed = _apply(state, MessageAction(task_id=TASK, source="USER", content="go on"))
    assert resumed.state.agent_state is AgentState.RUNNING
    assert resumed.state.max_budget_usd is not None
    assert abs(resumed.state.max_budget_usd - 0.03) < 1e-9
    assert isinstance(resumed.sent[-1][1], StepRequest)


def test_iteration_limit_grows_by_its_initial_amount_on_resume() -> None:
    state = TaskState(task_id=TASK, task="x", max_iterations=1, initial_max_iterations=1)
    turn = _apply(state, MessageAction(task_id=TASK, source="USER", content="x"))
    step = turn.sent[-1][1]
    error = ErrorObservation(task_id=TASK, source="AGENT", cause=step.id, content="bad")
    state = _apply(turn.state, error).state
    assert state.agent_state is AgentState.ERROR and "iterations (1)" in state.reason
    resumed = _apply(state, MessageAction(task_id=TASK, source="USER", content="more"))
    assert resumed.state.max_iterations == 2
    assert isinstance(resumed.sent[-1][1], StepRequest)


def _awaiting_confirmation() -> tuple[TaskState, CmdRunAction]:
    state, step = _started(confirmation_mode=True, confirmation_threshold=RiskLevel.MEDIUM)
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="pip install x")
    state = _apply(state, action).state
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.MEDIUM,
    )
    turn = _apply(state, verdict)
    assert turn.state.agent_state is AgentState.AWAITING_USER_CONFIRMATION
    assert turn.sent == []
    return turn.state, action


def test_confirmed_action_runs() -> None:
    state, action = _awaiting_confirmation()
    turn = _apply(
        state,
        ChangeAgentStateAction(
            task_id=TASK, source="USER", cause=action.id, agent_state=AgentState.USER_CONFIRMED
        ),
    )
    assert turn.state.agent_state is AgentState.RUNNING
    service, execute = turn.sent[-1]
    assert service is Service.RUNTIME and isinstance(execute, ExecuteAction)


def test_rejected_action_gives_a_user_reject_observation() -> None:
    state, action = _awaiting_confirmation()
    turn = _apply(
        state,
        ChangeAgentStateAction(
            task_id=TASK, source="USER", cause=action.id, agent_state=AgentState.USER_REJECTED
        ),
    )
    rejects = [e for e in turn.logged if isinstance(e, UserRejectObservation)]
    assert len(rejects) == 1 and rejects[0].cause == action.id
    assert turn.state.agent_state is AgentState.RUNNING
    assert isinstance(turn.sent[-1][1], StepRequest)


def test_low_risk_runs_without_confirmation() -> None:
    state, step = _started(confirmation_mode=True, confirmation_threshold=RiskLevel.MEDIUM)
    turn = _run_once(state, step, "ls", "a")
    assert turn.state.agent_state is AgentState.RUNNING


def test_delegation_creates_a_sub_task_and_its_outcome_reaches_the_parent() -> None:
    state, step = _started(initial_max_iterations=20)
    delegate = AgentDelegateAction(
        task_id=TASK, source="AGENT", cause=step.id, task="sub job", max_iterations=3
    )
    turn = _apply(state, delegate)
    child_id = sub_task_id(delegate.id)
    assert [t.task_id for t in turn.new_tasks] == [child_id]
    assert turn.new_tasks[0].max_iterations == 3
    assert turn.state.awaiting is Awaiting.DELEGATE and turn.state.sub_tasks == [child_id]
    first = turn.sent[-1][1]
    assert isinstance(first, MessageAction) and first.task_id == child_id

    child = _apply(turn.new_tasks[0], first)
    child_step = child.sent[-1][1]
    child_done = _apply(
        child.state,
        AgentFinishAction(
            task_id=child_id,
            source="AGENT",
            cause=child_step.id,
            final_message="sub done",
            outputs={"answer": 42},
        ),
    )
    report = [m for s, m in child_done.sent if isinstance(m, AgentDelegateObservation)]
    assert len(report) == 1 and report[0].task_id == TASK and report[0].outputs == {"answer": 42}

    parent = _apply(turn.state, report[0])
    assert isinstance(parent.sent[-1][1], StepRequest)
    assert parent.logged[-1].kind == "delegate_output"  # type: ignore[attr-defined]


def test_rate_limit_notice_shows_rate_limited_until_the_answer() -> None:
    state, step = _started()
    notice = ChangeAgentStateAction(
        task_id=TASK,
        source="SYSTEM",
        cause=step.id,
        agent_state=AgentState.RATE_LIMITED,
        reason="LLM rate limit: retrying in 2s",
    )
    limited = _apply(state, notice)
    assert limited.state.agent_state is AgentState.RATE_LIMITED
    assert limited.state.awaiting is Awaiting.AGENT and limited.sent == []
    answer = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    resumed = _apply(limited.state, answer)
    assert resumed.state.agent_state is AgentState.RUNNING
    assert resumed.state.awaiting is Awaiting.SECURITY


def test_a_sub_task_that_asks_a_question_hands_it_to_the_parent() -> None:
    state, step = _started(initial_max_iterations=20)
    delegate = AgentDelegateAction(task_id=TASK, source="AGENT", cause=step.id, task="sub job")
    turn = _apply(state, delegate)
    child = _apply(turn.new_tasks[0], turn.sent[-1][1])
    child_step = child.sent[-1][1]
    asked = _apply(
        child.state,
        MessageAction(
            task_id=child.state.task_id,
            source="AGENT",
            cause=child_step.id,
            content="Which file?",
            wait_for_response=True,
        ),
    )
    report = [m for _, m in asked.sent if isinstance(m, AgentDelegateObservation)]
    assert len(report) == 1 and report[0].content == "Which file?"
    assert report[0].agent_state is AgentState.AWAITING_USER_INPUT
    parent = _apply(turn.state, report[0])
    assert isinstance(parent.sent[-1][1], StepRequest)


def test_network_egress_travels_with_each_execute_order_and_to_sub_tasks() -> None:
    state, step = _started(network_egress=True)
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="curl x")
    state = _apply(state, action).state
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    service, execute = _apply(state, verdict).sent[-1]
    assert service is Service.RUNTIME and isinstance(execute, ExecuteAction)
    assert execute.network_egress

    state, step = _started(network_egress=True)
    delegate = AgentDelegateAction(task_id=TASK, source="AGENT", cause=step.id, task="sub")
    assert _apply(state, delegate).new_tasks[0].network_egress

    state, step = _started()
    state = _apply(state, action.model_copy(update={"cause": step.id})).state
    _, execute = _apply(state, verdict).sent[-1]
    assert isinstance(execute, ExecuteAction) and not execute.network_egress
