"""The agent's answer to a step: an action (reviewed on its way when it is runnable), a
question, the end, or a rate-limit notice while the reasoner waits for the LLM."""

from __future__ import annotations

from shared.commands import ReviewAction
from shared.events import (
    RUNNABLE_ACTION_TYPES,
    AgentDelegateAction,
    AgentFinishAction,
    AgentState,
    ChangeAgentStateAction,
    EventBase,
    EventSource,
    MessageAction,
    ReviewedAction,
    SecurityVerdictObservation,
    TaskTrackerAction,
)
from shared.state import Awaiting, TaskResult, TaskUsage
from shared.subjects import Service

from ..metrics import STALE
from ..turn import Turn
from .common import count, log, remember
from .delegation import delegate
from .from_security import from_security
from .next_hop import next_step

__all__ = [
    "from_agent",
    "is_rate_limit_notice",
    "rate_limited",
    "reviewed",
]


def _add_usage(turn: Turn, event: EventBase) -> None:
    usage = getattr(event, "llm_usage", None)
    if usage is None:
        return
    u = turn.state.usage
    turn.update(
        usage=TaskUsage(
            prompt_tokens=u.prompt_tokens + usage.prompt_tokens,
            completion_tokens=u.completion_tokens + usage.completion_tokens,
            cost_usd=u.cost_usd + usage.cost_usd,
            llm_calls=u.llm_calls + 1,
        )
    )


def is_rate_limit_notice(event: EventBase) -> bool:
    return (
        isinstance(event, ChangeAgentStateAction)
        and event.source is EventSource.SYSTEM
        and event.agent_state is AgentState.RATE_LIMITED
    )


def rate_limited(turn: Turn, event: EventBase) -> None:
    """The reasoner is waiting out a rate limit; the step stays in flight."""
    turn.log(event)
    if turn.state.agent_state is AgentState.RUNNING:
        turn.change_state(AgentState.RATE_LIMITED, getattr(event, "reason", ""), cause=event.id)


def reviewed(turn: Turn, event: ReviewedAction) -> None:
    """An action the security monitor reviewed on its way from the reasoner: the action's turn
    and its verdict's in one. A review the controller asked for itself (`_ask_again`) answers
    with the same message: then only the verdict is news."""
    s = turn.state
    if event.verdict.cause != event.action.id:
        count(turn, STALE.labels(event.kind))
        log.warning("task %s: review %s rules on another action", event.task_id, event.id)
    elif s.awaiting is Awaiting.AGENT and event.action.cause == s.awaiting_id:
        from_agent(turn, event.action, verdict=event.verdict)
    elif s.awaiting is Awaiting.SECURITY and event.verdict.cause == s.awaiting_id:
        from_security(turn, event.verdict)
    else:
        count(turn, STALE.labels(event.kind))
        log.info("task %s: ignoring stale review %s", event.task_id, event.id)


def from_agent(
    turn: Turn, event: EventBase, verdict: SecurityVerdictObservation | None = None
) -> None:
    if turn.state.agent_state is AgentState.RATE_LIMITED:
        turn.change_state(AgentState.RUNNING, "the LLM answered", cause=event.id)
    _add_usage(turn, event)
    action = turn.log(event)
    remember(turn, action)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None)

    if isinstance(action, AgentFinishAction):
        turn.update(result=TaskResult(final_message=action.final_message, outputs=action.outputs))
        turn.change_state(AgentState.FINISHED, "the agent finished", cause=action.id)
    elif isinstance(action, MessageAction) and action.wait_for_response:
        turn.change_state(AgentState.AWAITING_USER_INPUT, "the agent asked a question", action.id)
        turn.update(awaiting=Awaiting.USER, awaiting_id=action.id)
        if turn.state.parent_task_id:
            # No person watches a sub-task: its question goes back to the parent agent,
            # which would otherwise wait for ever.
            turn.report_to_parent(AgentState.AWAITING_USER_INPUT, action.content)
    elif isinstance(action, RUNNABLE_ACTION_TYPES):
        turn.update(awaiting=Awaiting.SECURITY, awaiting_id=action.id, pending_action=action)
        if verdict is None:
            turn.send(Service.SECURITY, ReviewAction(task_id=action.task_id, action=action))
        else:
            from_security(turn, verdict)
    elif isinstance(action, AgentDelegateAction):
        delegate(turn, action)
    else:  # think, a plan, a plain message, a condensation, or an error about a bad reply
        if isinstance(action, TaskTrackerAction) and action.command == "plan":
            turn.update(plan=action.tasks)  # shown with the task (console, `deckhands show`)
        next_step(turn)
