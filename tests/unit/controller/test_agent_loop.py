"""The controller's decisions, one input event at a time (no broker, no Redis)."""

from __future__ import annotations

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from shared.commands import ExecuteAction, ReleaseSandbox, ReviewAction, StepRequest
from shared.events import (
    AgentFinishAction,
    AgentState,
    AgentStateChangedObservation,
    ChangeAgentStateAction,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import Awaiting, TaskState
from shared.subjects import Service

TASK = "t1"


def _state(**kw: object) -> TaskState:
    return TaskState(task_id=TASK, task="do it", max_iterations=kw.pop("max_iterations", 5), **kw)  # type: ignore[arg-type]


def _turn(state: TaskState, event: object) -> Turn:
    turn = Turn(state)
    apply(turn, event)  # type: ignore[arg-type]
    return turn


def _start() -> tuple[Turn, StepRequest]:
    turn = _turn(_state(), MessageAction(task_id=TASK, source="USER", content="do it"))
    step = turn.sent[-1][1]
    assert isinstance(step, StepRequest)
    return turn, step


def test_user_task_starts_the_loop_and_asks_the_reasoner() -> None:
    turn, step = _start()
    kinds = [e.kind for e in turn.logged]  # type: ignore[attr-defined]
    # The log opens with what the task was created with (what a rebuild of its State needs).
    assert kinds == ["task_created", "message", "agent_state_changed"]
    assert [e.seq for e in turn.logged] == [1, 2, 3]
    assert turn.logged[0].max_iterations == 5  # type: ignore[attr-defined]
    assert turn.state.agent_state is AgentState.RUNNING
    assert (turn.state.awaiting, turn.state.awaiting_id) == (Awaiting.AGENT, step.id)
    assert step.after_seq == 3 and step.iteration == 1


def test_runnable_action_goes_to_security_then_runtime_then_next_step() -> None:
    turn, step = _start()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    turn = _turn(turn.state, action)
    service, review = turn.sent[-1]
    assert service is Service.SECURITY and isinstance(review, ReviewAction)
    assert turn.state.awaiting is Awaiting.SECURITY

    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    turn = _turn(turn.state, verdict)
    service, execute = turn.sent[-1]
    assert service is Service.RUNTIME and isinstance(execute, ExecuteAction)
    assert execute.action.id == action.id

    output = CmdOutputObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        command="ls",
        content="a",
        exit_code=0,
        cwd="/workspace",
    )
    turn = _turn(turn.state, output)
    assert isinstance(turn.sent[-1][1], StepRequest)
    assert turn.state.iteration == 2


def test_denied_action_becomes_an_error_the_agent_sees() -> None:
    turn, step = _start()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="rm -rf /")
    turn = _turn(turn.state, action)
    deny = SecurityVerdictObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        verdict=Verdict.DENY,
        risk=RiskLevel.HIGH,
        rule="delete_root",
        reason="no",
    )
    turn = _turn(turn.state, deny)
    error = turn.logged[-1]
    assert isinstance(error, ErrorObservation) and error.cause == action.id
    assert error.error_code == "security_denied"
    assert all(s is not Service.RUNTIME for s, _ in turn.sent)
    assert isinstance(turn.sent[-1][1], StepRequest)
    assert turn.state.agent_state is AgentState.RUNNING


def test_finish_records_the_result_and_releases_the_sandbox() -> None:
    turn, step = _start()
    finish = AgentFinishAction(
        task_id=TASK, source="AGENT", cause=step.id, final_message="done", outputs={"x": 1}
    )
    turn = _turn(turn.state, finish)
    assert turn.state.agent_state is AgentState.FINISHED
    assert turn.state.result is not None and turn.state.result.final_message == "done"
    assert isinstance(turn.sent[-1][1], ReleaseSandbox)


def test_iteration_limit_ends_in_error_with_the_reason() -> None:
    turn = _turn(_state(max_iterations=1), MessageAction(task_id=TASK, source="USER", content="x"))
    step = turn.sent[-1][1]
    error = ErrorObservation(task_id=TASK, source="AGENT", cause=step.id, content="bad reply")
    turn = _turn(turn.state, error)
    assert turn.state.agent_state is AgentState.ERROR
    assert "maximum number of iterations (1)" in turn.state.reason
    changed = turn.logged[-1]
    assert (
        isinstance(changed, AgentStateChangedObservation)
        and changed.agent_state is AgentState.ERROR
    )


def test_stale_answers_are_ignored_after_stop() -> None:
    turn, step = _start()
    turn = _turn(
        turn.state,
        ChangeAgentStateAction(task_id=TASK, source="USER", agent_state=AgentState.STOPPED),
    )
    assert turn.state.agent_state is AgentState.STOPPED
    late = CmdRunAction(task_id=TASK, source="AGENT", cause=step.id, command="ls")
    after = _turn(turn.state, late)
    assert after.logged == [] and after.sent == []


def test_illegal_transition_is_refused_with_a_clear_error() -> None:
    turn, _ = _start()
    stopped = _turn(
        turn.state,
        ChangeAgentStateAction(task_id=TASK, source="USER", agent_state=AgentState.STOPPED),
    ).state
    refused = _turn(
        stopped,
        ChangeAgentStateAction(task_id=TASK, source="USER", agent_state=AgentState.RUNNING),
    )
    error = refused.logged[-1]
    assert isinstance(error, ErrorObservation) and error.error_code == "illegal_transition"
    assert "STOPPED to RUNNING" in error.content
    assert refused.state.agent_state is AgentState.STOPPED
