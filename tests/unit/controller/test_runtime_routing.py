"""A task's runtime orders go to the replica holding its sandbox, as its last runtime answer
said; the first order, and any after an answer naming no replica, to the shared queue."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.controller.agent_loop import apply
from services.controller.turn import Turn
from shared.commands import ExecuteAction, ReleaseSandbox
from shared.events import (
    AgentFinishAction,
    CmdOutputObservation,
    CmdRunAction,
    ErrorObservation,
    EventBase,
    EventSource,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import Awaiting, TaskState
from shared.subjects import (
    ROUTED_STREAM,
    WORK_STREAM,
    Service,
    replica_of_routed,
    replica_token,
    routed_subject,
)

TASK = "t1"


def _turn(state: TaskState, event: EventBase) -> Turn:
    turn = Turn(state)
    apply(turn, event)
    return turn


def _to_runtime(turn: Turn) -> list[tuple[str, str]]:
    """(subject, stream) of each runtime order the turn sends."""
    sent = {m.id for service, m in turn.sent if service is Service.RUNTIME}
    return [(o.subject, o.stream) for o in turn.outbox() if o.msg_id in sent]


def _awaiting_runtime(state: TaskState) -> tuple[Turn, CmdRunAction]:
    """From a started task: an action the security monitor allowed, sent to the runtime."""
    turn = _turn(state, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    step = turn.state.awaiting_id
    action = CmdRunAction(task_id=TASK, source=EventSource.AGENT, cause=step, command="ls")
    turn = _turn(turn.state, action)
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    return _turn(turn.state, verdict), action


def _output(action: CmdRunAction, replica: str | None) -> CmdOutputObservation:
    return CmdOutputObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        command="ls",
        content="a",
        exit_code=0,
        cwd="/workspace",
        runtime_replica=replica,
    )


def _next_action(turn: Turn) -> tuple[Turn, CmdRunAction]:
    action = CmdRunAction(
        task_id=TASK, source=EventSource.AGENT, cause=turn.state.awaiting_id, command="pwd"
    )
    turn = _turn(turn.state, action)
    verdict = SecurityVerdictObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
    )
    return _turn(turn.state, verdict), action


def test_first_orders_go_to_the_shared_queue_then_to_the_holding_replica() -> None:
    state = TaskState(task_id=TASK, task="do it", max_iterations=5)
    turn, action = _awaiting_runtime(state)
    assert _to_runtime(turn) == [("deckhands.work.runtime.t1", WORK_STREAM)]

    turn = _turn(turn.state, _output(action, "node-a"))
    assert turn.state.runtime_replica == "node-a"
    assert turn.logged[0].runtime_replica == "node-a"  # type: ignore[attr-defined]
    turn, second = _next_action(turn)
    [order] = [m for s, m in turn.sent if s is Service.RUNTIME]
    assert isinstance(order, ExecuteAction) and order.action.id == second.id
    assert _to_runtime(turn) == [("deckhands.routed.runtime.node-a.t1", ROUTED_STREAM)]

    # The release of the ended task goes to the same replica (its engine holds the sandbox).
    turn = _turn(turn.state, _output(second, "node-a"))
    finish = AgentFinishAction(task_id=TASK, source=EventSource.AGENT, cause=turn.state.awaiting_id)
    turn = _turn(turn.state, finish)
    assert any(isinstance(m, ReleaseSandbox) for _, m in turn.sent)
    assert _to_runtime(turn) == [("deckhands.routed.runtime.node-a.t1", ROUTED_STREAM)]


def test_an_answer_naming_no_replica_sends_the_next_order_to_the_shared_queue() -> None:
    # The sandbox was lost: the replica that said so holds nothing now.
    state = TaskState(task_id=TASK, task="do it", max_iterations=5, runtime_replica="node-a")
    turn, action = _awaiting_runtime(state)
    assert _to_runtime(turn) == [("deckhands.routed.runtime.node-a.t1", ROUTED_STREAM)]
    lost = ErrorObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action.id,
        content="The task's sandbox was lost",
        error_code="sandbox_lost",
    )
    turn = _turn(turn.state, lost)
    assert turn.state.runtime_replica is None
    turn, _ = _next_action(turn)
    assert _to_runtime(turn) == [("deckhands.work.runtime.t1", WORK_STREAM)]


def test_a_stale_answer_does_not_move_the_task() -> None:
    state = TaskState(task_id=TASK, task="do it", max_iterations=5, runtime_replica="node-a")
    turn, action = _awaiting_runtime(state)
    other = _output(action, "node-b").model_copy(update={"cause": "another-action"})
    turn = _turn(turn.state, other)
    assert turn.state.runtime_replica == "node-a"
    assert turn.state.awaiting is Awaiting.RUNTIME


def test_replica_names_are_subject_tokens() -> None:
    assert replica_token("ip-10-0-1-2.eu-west-1.compute.internal") == (
        "ip-10-0-1-2_eu-west-1_compute_internal"
    )
    subject = routed_subject(Service.RUNTIME, "node-a", TASK)
    assert subject == "deckhands.routed.runtime.node-a.t1"
    assert replica_of_routed(subject) == "node-a"
    with pytest.raises(ValueError):
        routed_subject(Service.RUNTIME, "node.a", TASK)
    # An observation cannot name a replica that is no subject token (a forged route).
    with pytest.raises(ValidationError):
        CmdOutputObservation(
            task_id=TASK,
            source=EventSource.ENVIRONMENT,
            command="ls",
            content="",
            exit_code=0,
            cwd="/",
            runtime_replica="a.>",
        )
