"""A task's egress policy (issue 27) reaches the runtime with every order, is in the log's first
entry (so a rebuilt State keeps it), and passes to its sub-tasks."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from loop_steps import TASK, executed, started  # type: ignore[import-not-found]

from services.controller.agent_loop import apply, created_entry
from services.controller.agent_loop.next_hop import execute_order
from services.controller.rebuild import rebuild_state
from services.controller.turn import Turn
from services.security.handlers import reviewed
from shared.commands import ExecuteAction, PrepareSandbox, ReviewAction, StepRequest
from shared.egress_policy import EgressPolicy
from shared.events import (
    AgentDelegateAction,
    CmdRunAction,
    EgressActivityObservation,
    EgressConnection,
    EventSource,
    MessageAction,
    RiskLevel,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import TaskState
from shared.task_creation import creation_request, state_from_created

POLICY = EgressPolicy(allow=("pypi.org", "*.github.com:443"))


def _started(network: EgressPolicy | None = POLICY) -> tuple[TaskState, StepRequest, list[Any]]:
    return started(TaskState(task_id=TASK, task="do it", max_iterations=5, network=network))


def test_the_orders_carry_the_tasks_egress_policy() -> None:
    state, step, orders = _started()
    [prepare] = [o for o in orders if isinstance(o, PrepareSandbox)]
    assert prepare.network == POLICY and not prepare.network_egress
    order = executed(state, step)
    assert order.network == POLICY and not order.network_egress
    state, step, orders = _started(network=None)
    [prepare] = [o for o in orders if isinstance(o, PrepareSandbox)]
    assert prepare.network is None and executed(state, step).network is None


def test_the_first_log_entry_keeps_it_and_a_sub_task_inherits_it() -> None:
    state, step, _ = _started()
    assert created_entry(state).network == POLICY
    # The gateway's creation request carries it, and the State made of it has it.
    assert state_from_created(creation_request(state)).network == POLICY
    delegate = AgentDelegateAction(
        task_id=TASK, source=EventSource.AGENT, cause=step.id, task="sub"
    )
    turn = Turn(state)
    apply(turn, delegate)
    [child] = turn.new_tasks
    assert child.network == POLICY


def _activity() -> EgressActivityObservation:
    return EgressActivityObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        connections=[
            EgressConnection(
                host="pypi.org",
                port=443,
                allowed=True,
                bytes_out=700,
                bytes_in=90_000,
                duration_s=0.4,
                started_at=datetime.now(UTC),
            ),
            EgressConnection(
                host="evil.example.com",
                port=443,
                allowed=False,
                reason="not_allowed",
                started_at=datetime.now(UTC),
            ),
        ],
    )


def test_the_proxy_s_account_of_connections_is_logged_and_changes_nothing_else() -> None:
    state, step, _ = _started()
    turn = Turn(state)
    activity = _activity()
    apply(turn, activity)
    assert [e.id for e in turn.logged] == [activity.id]
    assert not turn.sent
    # The entry is among those the next step request carries (the reasoner shows the model none
    # of it); nothing else of the State changes.
    same = {"last_seq", "version", "updated_at", "unseen_events", "unseen_bytes"}
    assert turn.state.model_dump(exclude=same) == state.model_dump(exclude=same)
    # Between any two steps: the step asked for is still the one awaited.
    assert turn.state.awaiting_id == step.id


def test_a_log_with_connections_rebuilds_the_same_state() -> None:
    first = Turn(TaskState(task_id=TASK, task="do it", max_iterations=5, network=POLICY))
    apply(first, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    turn = Turn(first.state)
    apply(turn, _activity())
    rebuilt = rebuild_state([*first.logged, *turn.logged])
    without = rebuild_state(first.logged)
    assert rebuilt.last_seq == without.last_seq + 1 == turn.state.last_seq
    same = {"last_seq", "version", "updated_at", "unseen_events", "unseen_bytes", "processed"}
    assert rebuilt.model_dump(exclude=same) == without.model_dump(exclude=same)


def test_a_user_message_widens_the_policy_of_the_orders_from_then_on() -> None:
    state, step, _ = _started()
    more = EgressPolicy(allow=("files.pythonhosted.org", "pypi.org"))
    turn = Turn(state)
    message = MessageAction(
        task_id=TASK, source=EventSource.USER, content="you may fetch wheels too", network=more
    )
    apply(turn, message)
    assert turn.state.network == EgressPolicy(
        allow=("pypi.org", "*.github.com:443", "files.pythonhosted.org")
    )
    # The message, its rules with it, is the log's record of the change.
    assert turn.logged[0].id == message.id
    assert turn.logged[0].network == more  # type: ignore[attr-defined]
    order = executed(turn.state, step)
    assert order.network == turn.state.network


def test_a_task_without_a_policy_gains_none_from_a_message() -> None:
    state, _, _ = _started(network=None)
    turn = Turn(state)
    apply(
        turn,
        MessageAction(
            task_id=TASK, source=EventSource.USER, content="go", network=EgressPolicy(allow=("*",))
        ),
    )
    assert turn.state.network is None


def _verdict(action_id: str, scope: tuple[str, ...] | None) -> SecurityVerdictObservation:
    return SecurityVerdictObservation(
        task_id=TASK,
        source=EventSource.ENVIRONMENT,
        cause=action_id,
        verdict=Verdict.ALLOW,
        risk=RiskLevel.LOW,
        network_scope=scope,
    )


def _reviewed_with(state: TaskState, step: StepRequest, scope: tuple[str, ...] | None) -> Turn:
    action = CmdRunAction(task_id=TASK, source=EventSource.AGENT, cause=step.id, command="x")
    turn = Turn(state)
    review = ReviewAction(id=f"review-{action.id}", task_id=TASK, action=action)
    apply(turn, reviewed(review, _verdict(action.id, scope)))
    return turn


def test_the_verdict_s_scope_narrows_the_policy_for_that_action_only() -> None:
    """Issue 27, item 6: the order carries the scope within the task's policy (a host the
    policy does not allow is dropped: a scope never widens it); the policy itself is kept."""
    state, step, _ = _started()
    turn = _reviewed_with(state, step, ("pypi.org:443", "evil.example:443"))
    [order] = [o for _, o in turn.sent if isinstance(o, ExecuteAction)]
    assert order.network == POLICY
    assert order.network_scope == EgressPolicy(allow=("pypi.org:443",))
    assert turn.state.action_scope is not None
    assert turn.state.action_scope.action_id == order.action.id
    # Sent again (a rebuilt State, a re-request): the same scope.
    assert execute_order(turn.state, order.action).network_scope == order.network_scope


def test_no_scope_is_the_whole_policy_and_a_task_without_one_gets_none() -> None:
    state, step, _ = _started()
    [order] = [o for _, o in _reviewed_with(state, step, None).sent if isinstance(o, ExecuteAction)]
    assert order.network == POLICY and order.network_scope is None
    state, step, _ = _started(network=None)
    turn = _reviewed_with(state, step, ("pypi.org:443",))
    [order] = [o for _, o in turn.sent if isinstance(o, ExecuteAction)]
    assert order.network is None and order.network_scope is None


def test_a_rebuilt_state_has_the_same_scope() -> None:
    """The verdict, scope included, is in the log: a State rebuilt from it sends the same order."""
    first = Turn(TaskState(task_id=TASK, task="do it", max_iterations=5, network=POLICY))
    apply(first, MessageAction(task_id=TASK, source=EventSource.USER, content="do it"))
    step = next(o for _, o in first.sent if isinstance(o, StepRequest))
    second = _reviewed_with(first.state, step, ("pypi.org:443",))
    assert second.state.action_scope is not None
    rebuilt = rebuild_state([*first.logged, *second.logged])
    assert rebuilt.action_scope == second.state.action_scope
