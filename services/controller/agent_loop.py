"""What the controller does with each input event (seed 001's step loop, one event at a time).

`apply(turn, event)` is pure: it reads the State in `turn`, and records what to log, what
to send and how the State changes. Nothing here touches Redis or NATS.
"""

from __future__ import annotations

import logging

from prometheus_client import Counter

from shared.commands import ExecuteAction, ReviewAction, StepRequest
from shared.events import (
    RUNNABLE_ACTION_TYPES,
    AgentFinishAction,
    AgentState,
    AgentThinkAction,
    ChangeAgentStateAction,
    CmdRunAction,
    ErrorObservation,
    EventBase,
    EventSource,
    FileReadAction,
    FileWriteAction,
    MessageAction,
    RunPythonAction,
    SecurityVerdictObservation,
    Verdict,
)
from shared.state import Awaiting, TaskResult, TaskUsage
from shared.subjects import Service

from .turn import IllegalTransition, Turn

__all__ = ["apply"]

RunnableActionT = CmdRunAction | RunPythonAction | FileReadAction | FileWriteAction

log = logging.getLogger("deckhands.controller")

STALE = Counter(
    "deckhands_controller_stale_answers_total",
    "Answers that arrived after the task stopped waiting for them",
    ["kind"],
)
STEPS = Counter("deckhands_controller_steps_total", "Step requests sent to the reasoner")
# States in which the loop waits for a person, so no new step is requested.
_HELD = frozenset({AgentState.PAUSED, AgentState.AWAITING_USER_INPUT})


def apply(turn: Turn, event: EventBase) -> None:
    if event.source is EventSource.USER:
        _from_user(turn, event)
    elif turn.state.awaiting is Awaiting.AGENT and event.cause == turn.state.awaiting_id:
        _from_agent(turn, event)
    elif turn.state.awaiting is Awaiting.SECURITY and event.cause == turn.state.awaiting_id:
        _from_security(turn, event)
    elif turn.state.awaiting is Awaiting.RUNTIME and event.cause == turn.state.awaiting_id:
        _from_runtime(turn, event)
    else:
        # A late answer (the task was stopped meanwhile) or a duplicate: not part of the log.
        STALE.labels(getattr(event, "kind", "?")).inc()
        log.info("task %s: ignoring stale %s %s", event.task_id, type(event).__name__, event.id)


def _refuse(turn: Turn, event: EventBase, error: IllegalTransition) -> None:
    turn.log(
        ErrorObservation(
            task_id=event.task_id,
            source=EventSource.ENVIRONMENT,
            cause=event.id,
            content=f"Refused: {error}.",
            error_code="illegal_transition",
        )
    )


def _from_user(turn: Turn, event: EventBase) -> None:
    turn.log(event)
    state = turn.state.agent_state
    try:
        if isinstance(event, ChangeAgentStateAction):
            _user_changes_state(turn, event)
        elif isinstance(event, MessageAction):
            if state is AgentState.STOPPED:
                return
            if state is not AgentState.RUNNING and state is not AgentState.PAUSED:
                turn.change_state(AgentState.RUNNING, "user message", cause=event.id)
            if turn.state.awaiting is Awaiting.NOTHING or turn.state.awaiting is Awaiting.USER:
                _request_step(turn)
    except IllegalTransition as error:
        _refuse(turn, event, error)


def _user_changes_state(turn: Turn, event: ChangeAgentStateAction) -> None:
    target = event.agent_state
    if target not in {AgentState.STOPPED, AgentState.PAUSED, AgentState.RUNNING}:
        raise IllegalTransition(turn.state.agent_state, target)
    turn.change_state(target, event.reason or f"{target.value.lower()} by user", cause=event.id)
    if target is AgentState.STOPPED:
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None)
    elif target is AgentState.RUNNING and turn.state.awaiting is Awaiting.NOTHING:
        _request_step(turn)


def _from_agent(turn: Turn, event: EventBase) -> None:
    usage = getattr(event, "llm_usage", None)
    if usage is not None:
        u = turn.state.usage
        turn.update(
            usage=TaskUsage(
                prompt_tokens=u.prompt_tokens + usage.prompt_tokens,
                completion_tokens=u.completion_tokens + usage.completion_tokens,
                cost_usd=u.cost_usd + usage.cost_usd,
                llm_calls=u.llm_calls + 1,
            )
        )
    action = turn.log(event)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None)

    if isinstance(action, AgentFinishAction):
        turn.update(result=TaskResult(final_message=action.final_message, outputs=action.outputs))
        turn.change_state(AgentState.FINISHED, "the agent finished", cause=action.id)
    elif isinstance(action, MessageAction) and action.wait_for_response:
        turn.change_state(AgentState.AWAITING_USER_INPUT, "the agent asked a question", action.id)
        turn.update(awaiting=Awaiting.USER, awaiting_id=action.id)
    elif isinstance(action, RUNNABLE_ACTION_TYPES):
        turn.update(awaiting=Awaiting.SECURITY, awaiting_id=action.id, pending_action=action)
        turn.send(Service.SECURITY, ReviewAction(task_id=action.task_id, action=action))
    else:  # think, a plain message, or an ErrorObservation about a bad LLM reply
        if not isinstance(action, AgentThinkAction | MessageAction | ErrorObservation):
            log.warning("task %s: unexpected %s from the agent", action.task_id, action)
        _next_step(turn)


def _from_security(turn: Turn, event: EventBase) -> None:
    if not isinstance(event, SecurityVerdictObservation):
        turn.log(event)
        _next_step(turn)
        return
    verdict = turn.log(event)
    action_id = turn.state.awaiting_id
    assert isinstance(verdict, SecurityVerdictObservation) and action_id is not None
    if verdict.verdict is Verdict.ALLOW:
        action = _find_logged_action(turn, action_id)
        turn.update(awaiting=Awaiting.RUNTIME)
        turn.send(Service.RUNTIME, ExecuteAction(task_id=event.task_id, action=action))
        return
    turn.log(
        ErrorObservation(
            task_id=event.task_id,
            source=EventSource.ENVIRONMENT,
            cause=action_id,
            error_code="security_denied",
            content=f"The security monitor denied this action ({verdict.rule}): {verdict.reason}. "
            "Choose another way.",
        )
    )
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
    _next_step(turn)


def _find_logged_action(turn: Turn, action_id: str) -> RunnableActionT:
    pending = turn.state.pending_action
    if pending is None or pending.id != action_id:
        raise RuntimeError(f"task {turn.state.task_id}: approved action {action_id} is not pending")
    return pending


def _from_runtime(turn: Turn, event: EventBase) -> None:
    turn.log(event)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
    _next_step(turn)


def _next_step(turn: Turn) -> None:
    if turn.state.agent_state in _HELD or turn.state.agent_state is not AgentState.RUNNING:
        return
    _request_step(turn)


def _request_step(turn: Turn) -> None:
    state = turn.state
    if state.iteration >= state.max_iterations:
        turn.change_state(
            AgentState.ERROR,
            f"reached the maximum number of iterations ({state.max_iterations})",
        )
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None)
        return
    step = StepRequest(
        task_id=state.task_id, after_seq=state.last_seq, iteration=state.iteration + 1
    )
    turn.update(iteration=step.iteration, awaiting=Awaiting.AGENT, awaiting_id=step.id)
    turn.send(Service.REASONER, step)
    STEPS.inc()
