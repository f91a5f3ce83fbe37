"""Input from a person: a message, a stop, pause or resume, a confirmation or rejection."""

from __future__ import annotations

from shared.events import (
    AgentState,
    ChangeAgentStateAction,
    EventBase,
    EventSource,
    MessageAction,
    UserRejectObservation,
)
from shared.state import Approval, ApprovedBy, Awaiting
from shared.subjects import Service

from ..errors import IllegalTransition
from ..turn import Turn
from .common import refuse, remember
from .next_hop import execute_order, next_step, request_step

__all__ = [
    "from_user",
    "raise_limits",
]


def from_user(turn: Turn, event: EventBase) -> None:
    turn.log(event)
    try:
        if isinstance(event, ChangeAgentStateAction):
            _user_changes_state(turn, event)
        elif isinstance(event, MessageAction):
            _user_message(turn, event)
    except IllegalTransition as error:
        refuse(turn, event, str(error))


def _user_message(turn: Turn, event: MessageAction) -> None:
    state = turn.state.agent_state
    if state is AgentState.STOPPED:
        refuse(turn, event, "the task is stopped; start a new task")
        return
    # Interactive mode: the stuck detector only looks at history after the last user message.
    turn.update(recent=[], loop_hints=0)
    if event.network is not None and turn.state.network is not None:
        # Wider egress, asked for with the message (within the task's bound: the gateway's
        # check); the orders from now on carry it, and the runtime passes it to the proxy.
        turn.update(network=turn.state.network.union(event.network))
    if state is AgentState.AWAITING_USER_CONFIRMATION:
        return  # the message is in the log; the pending action still needs a yes or no
    if state is not AgentState.RUNNING and state is not AgentState.PAUSED:
        raise_limits(turn)
        turn.change_state(AgentState.RUNNING, "user message", cause=event.id)
    if turn.state.awaiting in (Awaiting.NOTHING, Awaiting.USER):
        request_step(turn)


def raise_limits(turn: Turn) -> None:
    """As in OpenHands: resuming raises a limit that was hit by its initial amount."""
    s = turn.state
    if s.iterations_used() >= s.max_iterations:
        turn.update(
            max_iterations=s.max_iterations + (s.initial_max_iterations or s.max_iterations)
        )
    spent = s.total_usage().cost_usd
    if s.max_budget_usd is not None and spent >= s.max_budget_usd:
        turn.update(max_budget_usd=spent + (s.initial_budget_usd or s.max_budget_usd))


def _user_changes_state(turn: Turn, event: ChangeAgentStateAction) -> None:
    target = event.agent_state
    if target in (AgentState.USER_CONFIRMED, AgentState.USER_REJECTED):
        _user_confirms(turn, event)
        return
    if target not in {AgentState.STOPPED, AgentState.PAUSED, AgentState.RUNNING}:
        raise IllegalTransition(turn.state.agent_state, target)
    turn.change_state(target, event.reason or f"{target.value.lower()} by user", cause=event.id)
    if target is AgentState.STOPPED:
        for child in turn.state.sub_tasks:
            turn.send(
                Service.CONTROLLER,
                ChangeAgentStateAction(
                    task_id=child,
                    source=EventSource.USER,
                    agent_state=AgentState.STOPPED,
                    reason="the parent task was stopped",
                ),
            )
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None, approval=None)
    elif target is AgentState.RUNNING and turn.state.awaiting is Awaiting.NOTHING:
        request_step(turn)


def _user_confirms(turn: Turn, event: ChangeAgentStateAction) -> None:
    s = turn.state
    if s.awaiting is not Awaiting.CONFIRMATION or s.pending_action is None:
        refuse(turn, event, "no action is awaiting confirmation")
        return
    if event.cause is not None and event.cause != s.awaiting_id:
        refuse(turn, event, f"action {event.cause} is not the one awaiting confirmation")
        return
    action = s.pending_action
    turn.change_state(event.agent_state, event.reason or "answered by the user", cause=event.id)
    if event.agent_state is AgentState.USER_CONFIRMED:
        turn.change_state(AgentState.RUNNING, "action confirmed", cause=event.id)
        turn.update(
            awaiting=Awaiting.RUNTIME,
            awaiting_id=action.id,
            approval=Approval(action_id=action.id, by=ApprovedBy.USER, answer_id=event.id),
        )
        turn.send(Service.RUNTIME, execute_order(turn.state, action))
        return
    remember(
        turn,
        turn.log(
            UserRejectObservation(task_id=action.task_id, source=EventSource.USER, cause=action.id)
        ),
    )
    turn.change_state(AgentState.RUNNING, "action rejected", cause=event.id)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
    next_step(turn)
