"""Answers that do not come: deadlines, re-requests, dead letters (pure logic, no I/O)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from services.controller.agent_loop import apply
from services.controller.deadlines import AnswerDeadlines
from services.controller.turn import Turn
from services.reasoner.replies import event_for_reply
from services.reasoner.tools import ToolCall
from shared.commands import ExecuteAction, StepRequest
from shared.delivery import missing_answer_notice
from shared.events import (
    AgentState,
    AnswerMissingObservation,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    MessageAction,
    SandboxQueuedObservation,
)
from shared.state import Awaiting, TaskState
from shared.subjects import Service, work_subject

TASK = "t1"
NOW = datetime(2026, 11, 23, tzinfo=UTC)
DEADLINES = AnswerDeadlines(agent_s=10, security_s=5, runtime_s=20)


def _step(turn: Turn, event: object) -> Turn:
    before = turn.state
    apply(turn, event)  # type: ignore[arg-type]
    turn.update(**DEADLINES.rearm(before, turn.state, event, NOW))  # type: ignore[arg-type]
    return turn


def _overdue(state: TaskState, why: str = "overdue") -> AnswerMissingObservation:
    return AnswerMissingObservation(
        task_id=TASK,
        source="SYSTEM",
        cause=state.awaiting_id,
        why=why,  # type: ignore[arg-type]
        awaiting=state.awaiting.value,
        attempt=state.awaiting_attempt,
        detail="boom",
    )


def _started() -> Turn:
    state = TaskState(task_id=TASK, task="do it", max_iterations=5)
    return _step(Turn(state), MessageAction(task_id=TASK, source="USER", content="do it"))


def test_a_step_request_gets_a_deadline() -> None:
    turn = _started()
    assert turn.state.awaiting is Awaiting.AGENT
    assert turn.state.awaiting_deadline == NOW + timedelta(seconds=10)
    assert turn.state.awaiting_attempt == 0


def test_an_overdue_step_is_asked_again_then_the_task_ends_in_error() -> None:
    turn = _started()
    first = turn.state.awaiting_id
    for attempt in (1, 2):
        turn = _step(Turn(turn.state, answer_retries=2), _overdue(turn.state))
        step = turn.sent[-1][1]
        assert turn.sent[-1][0] is Service.REASONER and isinstance(step, StepRequest)
        assert step.id == turn.state.awaiting_id != first
        assert step.iteration == 1  # the same step, not a new one
        assert turn.state.awaiting_attempt == attempt
        assert turn.state.awaiting_deadline == NOW + timedelta(seconds=10)
        assert turn.state.agent_state is AgentState.RUNNING
    turn = _step(Turn(turn.state, answer_retries=2), _overdue(turn.state))
    assert turn.state.agent_state is AgentState.ERROR
    assert "no answer from the reasoner" in turn.state.reason
    assert "after 3 requests" in turn.state.reason
    assert turn.state.awaiting is Awaiting.NOTHING and turn.state.awaiting_deadline is None


def test_an_overdue_action_is_sent_again_with_the_same_action_id() -> None:
    turn = _started()
    step_id = turn.state.awaiting_id
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=step_id, command="sleep 1")
    turn = _step(Turn(turn.state), action)  # to security
    assert turn.state.awaiting_deadline == NOW + timedelta(seconds=5)
    state = turn.state.model_copy(update={"awaiting": Awaiting.RUNTIME})
    turn = _step(Turn(state), _overdue(state))
    order = turn.sent[-1][1]
    assert isinstance(order, ExecuteAction) and order.action.id == action.id
    assert turn.state.awaiting_attempt == 1


def test_an_action_queued_for_a_sandbox_is_logged_and_waits_the_queue_deadline() -> None:
    turn = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=turn.state.awaiting_id, command="ls")
    turn = _step(Turn(turn.state), action)
    state = turn.state.model_copy(
        update={"awaiting": Awaiting.RUNTIME, "awaiting_id": action.id, "pending_action": action}
    )
    queued = SandboxQueuedObservation(
        task_id=TASK, source="ENVIRONMENT", cause=action.id, position=3, max_sandboxes=20
    )
    turn = _step(Turn(state), queued)
    assert [e.kind for e in turn.logged] == ["sandbox_queued"]
    assert not turn.sent  # the runtime keeps the order and runs it once seated
    assert turn.state.awaiting is Awaiting.RUNTIME and turn.state.awaiting_id == action.id
    assert turn.state.awaiting_deadline == NOW + timedelta(seconds=DEADLINES.queue_s)
    # The action's observation is still the answer.
    done = CmdOutputObservation(
        task_id=TASK,
        source="ENVIRONMENT",
        cause=action.id,
        command="ls",
        content="",
        exit_code=0,
        cwd="/workspace",
    )
    turn = _step(Turn(turn.state), done)
    assert turn.state.awaiting is Awaiting.AGENT
    # A notice for an action no longer awaited is stale.
    late = _step(Turn(turn.state), queued.model_copy(update={"id": "another"}))
    assert late.state == turn.state and not late.logged


def test_a_dead_lettered_order_ends_the_task_in_error_with_the_reason() -> None:
    turn = _started()
    turn = _step(Turn(turn.state), _overdue(turn.state, why="dead_lettered"))
    assert turn.state.agent_state is AgentState.ERROR
    assert "gave up" in turn.state.reason and "boom" in turn.state.reason


def test_a_stale_notice_changes_nothing() -> None:
    turn = _started()
    stale = _overdue(turn.state).model_copy(update={"cause": "an-old-step"})
    after = _step(Turn(turn.state), stale)
    assert after.state == turn.state and not after.sent and not after.logged


def test_dead_letter_notice_names_the_awaited_order() -> None:
    step = StepRequest(task_id=TASK, after_seq=2, iteration=1)
    notice = missing_answer_notice(
        work_subject(Service.REASONER, TASK), step.model_dump_json().encode(), "storage down"
    )
    assert notice is not None and notice.cause == step.id and notice.why == "dead_lettered"
    assert notice.awaiting == "agent" and "storage down" in notice.detail
    action = CmdRunAction(task_id=TASK, source="AGENT", command="ls")
    order = ExecuteAction(task_id=TASK, action=action).model_dump_json().encode()
    runtime = missing_answer_notice(work_subject(Service.RUNTIME, TASK), order, "x")
    assert runtime is not None and runtime.cause == action.id
    # Garbage, and a notice about a notice, tell nobody.
    assert missing_answer_notice(work_subject(Service.RUNTIME, TASK), b"\xff{", "x") is None
    about = json.dumps({"kind": "answer_missing", "cause": "c"}).encode()
    assert missing_answer_notice(work_subject(Service.CONTROLLER, TASK), about, "x") is None


def test_an_action_too_large_to_carry_is_an_error_the_agent_sees() -> None:
    from services.reasoner.replies import LLMReply

    step = StepRequest(task_id=TASK, after_seq=2, iteration=1)
    code = "x" * 1_500_000
    call = ToolCall(name="execute_python", arguments=json.dumps({"code": code}), id="c1")
    reply = LLMReply(content="", tool_calls=[call])
    event = event_for_reply(step, reply, native=True)
    assert isinstance(event, ErrorObservation) and event.error_code == "bad_llm_reply"
    assert "over the limit" in event.content and len(event.model_dump_json()) < 2000


def test_after_a_rebuild_a_queued_action_is_sent_again_once() -> None:
    """Rebuilt while the action was on its way to the runtime: the runtime's "queued" may name
    the queue Redis lost, so the order goes again (same action), once."""
    turn = _started()
    action = CmdRunAction(task_id=TASK, source="AGENT", cause=turn.state.awaiting_id, command="ls")
    state = turn.state.model_copy(
        update={
            "awaiting": Awaiting.RUNTIME,
            "awaiting_id": action.id,
            "pending_action": action,
            "requeue_if_queued": True,
        }
    )
    queued = SandboxQueuedObservation(
        task_id=TASK, source="ENVIRONMENT", cause=action.id, position=1, max_sandboxes=4
    )
    turn = _step(Turn(state), queued)
    assert [e.kind for e in turn.logged] == ["sandbox_queued"]
    assert len(turn.sent) == 1 and turn.sent[0][0] is Service.RUNTIME
    order = turn.sent[0][1]
    assert isinstance(order, ExecuteAction) and order.action.id == action.id
    assert not turn.state.requeue_if_queued
    again = _step(Turn(turn.state), queued.model_copy(update={"id": "queued-again"}))
    assert not again.sent  # once only
