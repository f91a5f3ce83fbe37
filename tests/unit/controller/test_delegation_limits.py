"""Delegation cannot multiply what a task was given (issue 9, part 3): a sub-task's iterations
and budget come out of its parent's remainder, its spend is added to the parent's (so to the
root's), and the tree's depth and each task's fan-out are bounded. And the approval the runtime
checks (part 6) is recorded with the action the State awaits."""

from __future__ import annotations

from typing import Any

from loop_steps import TASK, apply_event  # type: ignore[import-not-found]

from services.controller.agent_loop import sub_task_id
from services.controller.turn import Turn
from shared.commands import ORDER_REFUSED, ExecuteAction, StepRequest
from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentState,
    ChangeAgentStateAction,
    CmdRunAction,
    ErrorObservation,
    LLMUsage,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    SubTaskSpend,
    Verdict,
)
from shared.state import ApprovedBy, Awaiting, TaskState


def _started(**fields: Any) -> tuple[TaskState, StepRequest]:
    fields.setdefault("max_iterations", 10)
    state = TaskState(task_id=TASK, task="x", initial_max_iterations=10, **fields)
    turn = apply_event(state, MessageAction(task_id=TASK, source="USER", content="x"))
    step = turn.sent[-1][1]
    assert isinstance(step, StepRequest)
    return turn.state, step


def _delegate(step: StepRequest, cost_usd: float = 0.0, **fields: Any) -> AgentDelegateAction:
    usage = LLMUsage(model="m", cost_usd=cost_usd) if cost_usd else None
    return AgentDelegateAction(
        task_id=TASK, source="AGENT", cause=step.id, task="sub job", llm_usage=usage, **fields
    )


def _refused(turn: Turn, sub_tasks: list[str] | None = None) -> str:
    """The refusal the agent sees; nothing was created and the next step is asked for."""
    assert turn.new_tasks == [] and turn.state.sub_tasks == (sub_tasks or [])
    errors = [e for e in turn.logged if isinstance(e, ErrorObservation)]
    assert len(errors) == 1 and errors[0].error_code == "delegation_refused"
    assert not [m for _, m in turn.sent if isinstance(m, MessageAction)]
    # The agent is told, and goes on (or its task ends at a limit).
    stepped = bool(turn.sent) and isinstance(turn.sent[-1][1], StepRequest)
    assert stepped or turn.state.agent_state is AgentState.ERROR
    return errors[0].content


def test_a_sub_task_asking_more_iterations_than_the_parent_has_left_is_refused() -> None:
    state, step = _started()  # 10 iterations, 1 used by this step
    content = _refused(apply_event(state, _delegate(step, max_iterations=10)))
    assert "asks for 10 iterations, more than this task has left (9)" in content


def test_a_sub_task_gets_at_most_what_the_parent_has_left() -> None:
    state, step = _started(max_budget_usd=1.0, initial_budget_usd=1.0)
    turn = apply_event(state, _delegate(step, cost_usd=0.25))
    [child] = turn.new_tasks
    assert child.max_iterations == child.initial_max_iterations == 9
    assert child.max_budget_usd == child.initial_budget_usd == 0.75
    assert child.delegation_depth == 1 and child.parent_task_id == TASK


def test_a_delegation_when_the_budget_is_spent_is_refused() -> None:
    state, step = _started(max_budget_usd=0.5, initial_budget_usd=0.5)
    turn = apply_event(state, _delegate(step, cost_usd=0.5))
    assert "budget ($0.5000) is spent" in _refused(turn)
    assert "reached the maximum budget" in turn.state.reason


def test_depth_and_fan_out_are_bounded() -> None:
    state, step = _started(delegation_depth=2, max_delegation_depth=2)
    assert "3 levels deep, past the limit of 2" in _refused(apply_event(state, _delegate(step)))

    state, step = _started(max_sub_tasks=1, sub_tasks=["earlier"])
    assert "delegated 1 sub-tasks, the most one task may (1)" in _refused(
        apply_event(state, _delegate(step)), ["earlier"]
    )

    state, step = _started(max_delegation_depth=0)
    assert "past the limit of 0" in _refused(apply_event(state, _delegate(step)))


def test_the_limits_travel_to_sub_tasks() -> None:
    state, step = _started(delegation_depth=1, max_delegation_depth=2, max_sub_tasks=4)
    [child] = apply_event(state, _delegate(step)).new_tasks
    assert (child.delegation_depth, child.max_delegation_depth, child.max_sub_tasks) == (2, 2, 4)


def _child_finishes(child: TaskState, first: Any, cost_usd: float) -> AgentDelegateObservation:
    started = apply_event(child, first)
    child_step = started.sent[-1][1]
    done = apply_event(
        started.state,
        AgentFinishAction(
            task_id=child.task_id,
            source="AGENT",
            cause=child_step.id,
            final_message="sub done",
            llm_usage=LLMUsage(model="m", prompt_tokens=10, cost_usd=cost_usd),
        ),
    )
    [report] = [m for _, m in done.sent if isinstance(m, AgentDelegateObservation)]
    return report


def test_the_sub_tasks_spend_and_iterations_are_the_parents() -> None:
    state, step = _started(max_budget_usd=1.0, initial_budget_usd=1.0)
    turn = apply_event(state, _delegate(step, cost_usd=0.25))
    report = _child_finishes(turn.new_tasks[0], turn.sent[-1][1], cost_usd=0.5)
    assert report.spent == SubTaskSpend(iterations=1, prompt_tokens=10, cost_usd=0.5, llm_calls=1)
    parent = apply_event(turn.state, report).state
    assert parent.iterations_used() == 3  # its own 2 steps (the next asked for) and the child's 1
    assert parent.total_usage().cost_usd == 0.75
    assert parent.usage.cost_usd == 0.25  # its own calls, as before
    # The same report again (a redelivery under another id) is not counted twice.
    again = report.model_copy(update={"id": "another"})
    assert apply_event(parent, again).state.total_usage().cost_usd == 0.75


def test_a_parent_whose_sub_tasks_spent_its_budget_stops_in_error() -> None:
    state, step = _started(max_budget_usd=1.0, initial_budget_usd=1.0)
    turn = apply_event(state, _delegate(step))
    report = _child_finishes(turn.new_tasks[0], turn.sent[-1][1], cost_usd=1.0)
    parent = apply_event(turn.state, report)
    assert parent.state.agent_state is AgentState.ERROR
    assert "reached the maximum budget ($1.0000; spent $1.0000)" in parent.state.reason


def test_a_late_report_still_adds_its_spend_to_a_stopped_parent() -> None:
    state, step = _started(max_budget_usd=1.0, initial_budget_usd=1.0)
    turn = apply_event(state, _delegate(step))
    child_first = turn.sent[-1][1]
    stopped = apply_event(
        turn.state,
        ChangeAgentStateAction(task_id=TASK, source="USER", agent_state=AgentState.STOPPED),
    ).state
    report = _child_finishes(turn.new_tasks[0], child_first, cost_usd=0.4)
    late = apply_event(stopped, report)
    assert late.logged == [] and late.sent == []  # stale: not logged, nothing asked
    assert late.state.total_usage().cost_usd == 0.4
    # A report from a task that is not one of its sub-tasks counts for nothing.
    foreign = report.model_copy(update={"sub_task_id": sub_task_id("someone else")})
    assert apply_event(stopped, foreign).state.total_usage().cost_usd == 0.0


# --- what the runtime checks (part 6) -----------------------------------------------------


def _verdict(action: CmdRunAction, risk: RiskLevel = RiskLevel.LOW) -> SecurityVerdictObservation:
    return SecurityVerdictObservation(
        task_id=TASK, source="ENVIRONMENT", cause=action.id, verdict=Verdict.ALLOW, risk=risk
    )


def test_an_allowed_action_is_sent_with_its_approval_in_the_state() -> None:
    state, step = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    reviewing = apply_event(state, action).state
    assert reviewing.approval is None and reviewing.awaiting is Awaiting.SECURITY
    verdict = _verdict(action)
    turn = apply_event(reviewing, verdict)
    approval = turn.state.approval
    assert approval is not None
    assert (approval.action_id, approval.by, approval.answer_id) == (
        action.id,
        ApprovedBy.SECURITY,
        verdict.id,
    )
    assert turn.state.pending_action is not None
    [(_, order)] = [(s, m) for s, m in turn.sent if isinstance(m, ExecuteAction)]
    assert order.action == turn.state.pending_action  # exactly what the runtime compares


def test_a_confirmed_action_is_approved_by_the_user() -> None:
    state, step = _started(confirmation_mode=True, confirmation_threshold=RiskLevel.LOW)
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="rm x")
    waiting = apply_event(apply_event(state, action).state, _verdict(action)).state
    assert waiting.awaiting is Awaiting.CONFIRMATION and waiting.approval is None
    yes = ChangeAgentStateAction(
        task_id=TASK, source="USER", agent_state=AgentState.USER_CONFIRMED, cause=action.id
    )
    confirmed = apply_event(waiting, yes).state
    assert confirmed.approval is not None and confirmed.approval.by is ApprovedBy.USER
    assert confirmed.approval.answer_id == yes.id and confirmed.awaiting is Awaiting.RUNTIME


def test_a_runtime_refusal_is_ignored_unless_the_task_awaits_that_runtime_answer() -> None:
    state, step = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    reviewing = apply_event(state, action).state
    refusal = ErrorObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        error_code=ORDER_REFUSED,
        content="The runtime refused to run this action: ...",
    )
    # A forged order during the review: its refusal must not stand in for the verdict.
    ignored = apply_event(reviewing, refusal)
    assert ignored.logged == [] and ignored.sent == []
    assert ignored.state.awaiting is Awaiting.SECURITY
    # Awaiting the runtime (the task was paused before its order arrived): the agent sees why.
    running = apply_event(reviewing, _verdict(action)).state
    answered = apply_event(running, refusal)
    assert [e.kind for e in answered.logged] == ["error"]
    assert answered.state.awaiting is not Awaiting.RUNTIME and answered.state.approval is None
