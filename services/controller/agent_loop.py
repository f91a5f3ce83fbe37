"""What the controller does with each input event (seed 001's step loop, one event at a time).

`apply(turn, event)` is pure: it reads the State in `turn`, and records what to log, what
to send and how the State changes. Nothing here touches Redis or NATS.
"""

from __future__ import annotations

import logging
import uuid

from prometheus_client import Counter

from shared.commands import (
    ORDER_REFUSED,
    ExecuteAction,
    PrepareSandbox,
    ReviewAction,
    StepRequest,
)
from shared.events import (
    RUNNABLE_ACTION_TYPES,
    AgentDelegateAction,
    AgentDelegateObservation,
    AgentFinishAction,
    AgentState,
    AnswerMissingObservation,
    ChangeAgentStateAction,
    ErrorObservation,
    EventBase,
    EventSource,
    MessageAction,
    ReviewedAction,
    RiskLevel,
    RunnableAction,
    SandboxQueuedObservation,
    SecurityVerdictObservation,
    TaskCreatedObservation,
    UserRejectObservation,
    Verdict,
)
from shared.state import Approval, ApprovedBy, Awaiting, TaskResult, TaskState, TaskUsage
from shared.subjects import Service

from .errors import IllegalTransition
from .metrics import DELEGATIONS_REFUSED, QUEUED, RE_REQUESTS, STALE, STEPS, STUCK
from .stuck import SIGNATURES_KEPT, detect, signature
from .turn import Turn

__all__ = [
    "CONTROLLER_ERROR_CODES",
    "apply",
    "ask_for_lost_step",
    "created_entry",
    "send_queued_action",
    "sub_task_id",
]


log = logging.getLogger("deckhands.controller")

# The error codes of the ErrorObservations the controller itself logs (the other services'
# errors come to it as inputs): a rebuild tells the two apart by them.
ILLEGAL_TRANSITION = "illegal_transition"
DELEGATION_REFUSED = "delegation_refused"
SECURITY_DENIED = "security_denied"
CONTROLLER_ERROR_CODES = frozenset({ILLEGAL_TRANSITION, DELEGATION_REFUSED, SECURITY_DENIED})
_RISK_ORDER = {RiskLevel.LOW: 0, RiskLevel.MEDIUM: 1, RiskLevel.HIGH: 2}
_SUB_TASK_NS = uuid.UUID("0b6f3c1e-8a4d-4c5e-9f2a-7d1e3b5c9a80")


def _count(turn: Turn, counter: Counter) -> None:
    """Count what the turn did, unless it is a replay of the log (a rebuild): that was counted
    when it happened."""
    if not turn.replaying:
        counter.inc()


def sub_task_id(delegate_action_id: str) -> str:
    """Derived from the action, so a redelivered delegation names the same sub-task."""
    return uuid.uuid5(_SUB_TASK_NS, delegate_action_id).hex


def apply(turn: Turn, event: EventBase) -> None:
    if turn.state.last_seq == 0:
        # The task's first turn: its log opens with what the task was created with, so that
        # the log alone can rebuild its State (services/controller/rebuild.py).
        turn.log(created_entry(turn.state))
    awaiting, awaiting_id = turn.state.awaiting, turn.state.awaiting_id
    if isinstance(event, ReviewedAction):
        _reviewed(turn, event)
    elif event.source is EventSource.USER:
        _from_user(turn, event)
    elif isinstance(event, AgentDelegateObservation) and not _answers(turn.state, event):
        # A sub-task reporting after its parent stopped waiting (the parent was stopped, or
        # the sub-task ended after asking a question): not part of the log, but what it spent
        # is still the parent's (and so the root's).
        _count_sub_task_spend(turn, event)
        _count(turn, STALE.labels(event.kind))
    elif (
        event.cause is None
        or event.cause != awaiting_id
        or (_is_order_refusal(event) and awaiting is not Awaiting.RUNTIME)
    ):
        # A late answer (the task was stopped meanwhile) or a duplicate: not part of the log.
        # So is the runtime's refusal of an order the task did not send it (forged while the
        # action was still under review or awaiting confirmation).
        _count(turn, STALE.labels(getattr(event, "kind", "?")))
        log.info("task %s: ignoring stale %s %s", event.task_id, type(event).__name__, event.id)
    elif isinstance(event, AnswerMissingObservation):
        _answer_missing(turn, event)
    elif isinstance(event, SandboxQueuedObservation):
        _queued(turn, event)
    elif awaiting is Awaiting.AGENT and _is_rate_limit_notice(event):
        _rate_limited(turn, event)
    elif awaiting is Awaiting.AGENT:
        _from_agent(turn, event)
    elif awaiting is Awaiting.SECURITY:
        _from_security(turn, event)
    elif awaiting in (Awaiting.RUNTIME, Awaiting.DELEGATE):
        _observed(turn, event)
    else:
        _count(turn, STALE.labels(getattr(event, "kind", "?")))


def created_entry(state: TaskState) -> TaskCreatedObservation:
    """The log's first entry: the limits and settings of a task not yet started."""
    return TaskCreatedObservation(
        id=f"created-{state.task_id}",  # one per task, however often its first turn is retried
        task_id=state.task_id,
        source=EventSource.SYSTEM,
        created_at=state.created_at,
        max_iterations=state.max_iterations,
        initial_max_iterations=state.initial_max_iterations,
        max_budget_usd=state.max_budget_usd,
        initial_budget_usd=state.initial_budget_usd,
        confirmation_mode=state.confirmation_mode,
        confirmation_threshold=state.confirmation_threshold,
        network_egress=state.network_egress,
        workspace_mib=state.workspace_mib,
        tenant_id=state.tenant_id,
        priority=state.priority,
        delegation_depth=state.delegation_depth,
        max_delegation_depth=state.max_delegation_depth,
        max_sub_tasks=state.max_sub_tasks,
        parent_task_id=state.parent_task_id,
        parent_action_id=state.parent_action_id,
    )


def step_request(state: TaskState, iteration: int) -> StepRequest:
    """The reasoner's order for the step after the log's last entry: the tenant and priority
    say where its LLM call stands among those waiting for the model."""
    return StepRequest(
        task_id=state.task_id,
        after_seq=state.last_seq,
        iteration=iteration,
        tenant_id=state.tenant_id,
        priority=state.priority,
    )


def ask_for_lost_step(turn: Turn) -> None:
    """A State rebuilt from the log awaits a step whose request id no entry names (requests are
    not logged): ask for the step again, under a new id. A late answer to the lost request is
    then stale and ignored."""
    s = turn.state
    step = step_request(s, s.iteration)
    turn.update(awaiting=Awaiting.AGENT, awaiting_id=step.id)
    turn.send(Service.REASONER, step)
    _count(turn, RE_REQUESTS.labels(Awaiting.AGENT.value))


def send_queued_action(turn: Turn) -> None:
    """A rebuilt State whose action waited for a sandbox seat: the runtime kept that order in
    Redis, which lost it, so it is sent again (same action id: it still runs at most once)."""
    action = turn.state.pending_action
    if turn.state.awaiting is Awaiting.RUNTIME and action is not None:
        turn.send(Service.RUNTIME, _execute(turn.state, action))


def _answers(state: TaskState, event: EventBase) -> bool:
    return (
        event.cause is not None
        and event.cause == state.awaiting_id
        and (state.awaiting is Awaiting.DELEGATE)
    )


def _count_sub_task_spend(turn: Turn, event: AgentDelegateObservation) -> None:
    """Keep the sub-task's latest (cumulative) report; only this task's own sub-tasks count."""
    if event.spent is None or event.sub_task_id not in turn.state.sub_tasks:
        return
    turn.update(sub_task_spend={**turn.state.sub_task_spend, event.sub_task_id: event.spent})


def _is_order_refusal(event: EventBase) -> bool:
    return isinstance(event, ErrorObservation) and event.error_code == ORDER_REFUSED


def _remember(turn: Turn, event: EventBase) -> None:
    sig = signature(event)
    if sig is not None:
        turn.update(recent=[*turn.state.recent, sig][-SIGNATURES_KEPT:])


def _refuse(turn: Turn, event: EventBase, reason: str) -> None:
    turn.log(
        ErrorObservation(
            task_id=event.task_id,
            source=EventSource.ENVIRONMENT,
            cause=event.id,
            content=f"Refused: {reason}.",
            error_code=ILLEGAL_TRANSITION,
        )
    )


# --- the user ------------------------------------------------------------------------------


def _from_user(turn: Turn, event: EventBase) -> None:
    turn.log(event)
    try:
        if isinstance(event, ChangeAgentStateAction):
            _user_changes_state(turn, event)
        elif isinstance(event, MessageAction):
            _user_message(turn, event)
    except IllegalTransition as error:
        _refuse(turn, event, str(error))


def _user_message(turn: Turn, event: MessageAction) -> None:
    state = turn.state.agent_state
    if state is AgentState.STOPPED:
        _refuse(turn, event, "the task is stopped; start a new task")
        return
    # Interactive mode: the stuck detector only looks at history after the last user message.
    turn.update(recent=[])
    if state is AgentState.AWAITING_USER_CONFIRMATION:
        return  # the message is in the log; the pending action still needs a yes or no
    if state is not AgentState.RUNNING and state is not AgentState.PAUSED:
        _raise_limits(turn)
        turn.change_state(AgentState.RUNNING, "user message", cause=event.id)
    if turn.state.awaiting in (Awaiting.NOTHING, Awaiting.USER):
        _request_step(turn)


def _raise_limits(turn: Turn) -> None:
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
        _request_step(turn)


def _user_confirms(turn: Turn, event: ChangeAgentStateAction) -> None:
    s = turn.state
    if s.awaiting is not Awaiting.CONFIRMATION or s.pending_action is None:
        _refuse(turn, event, "no action is awaiting confirmation")
        return
    if event.cause is not None and event.cause != s.awaiting_id:
        _refuse(turn, event, f"action {event.cause} is not the one awaiting confirmation")
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
        turn.send(Service.RUNTIME, _execute(turn.state, action))
        return
    _remember(
        turn,
        turn.log(
            UserRejectObservation(task_id=action.task_id, source=EventSource.USER, cause=action.id)
        ),
    )
    turn.change_state(AgentState.RUNNING, "action rejected", cause=event.id)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
    _next_step(turn)


# --- the agent -----------------------------------------------------------------------------


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


def _is_rate_limit_notice(event: EventBase) -> bool:
    return (
        isinstance(event, ChangeAgentStateAction)
        and event.source is EventSource.SYSTEM
        and event.agent_state is AgentState.RATE_LIMITED
    )


def _rate_limited(turn: Turn, event: EventBase) -> None:
    """The reasoner is waiting out a rate limit; the step stays in flight."""
    turn.log(event)
    if turn.state.agent_state is AgentState.RUNNING:
        turn.change_state(AgentState.RATE_LIMITED, getattr(event, "reason", ""), cause=event.id)


def _reviewed(turn: Turn, event: ReviewedAction) -> None:
    """An action the security monitor reviewed on its way from the reasoner: the action's turn
    and its verdict's in one. A review the controller asked for itself (`_ask_again`) answers
    with the same message: then only the verdict is news."""
    s = turn.state
    if event.verdict.cause != event.action.id:
        _count(turn, STALE.labels(event.kind))
        log.warning("task %s: review %s rules on another action", event.task_id, event.id)
    elif s.awaiting is Awaiting.AGENT and event.action.cause == s.awaiting_id:
        _from_agent(turn, event.action, verdict=event.verdict)
    elif s.awaiting is Awaiting.SECURITY and event.verdict.cause == s.awaiting_id:
        _from_security(turn, event.verdict)
    else:
        _count(turn, STALE.labels(event.kind))
        log.info("task %s: ignoring stale review %s", event.task_id, event.id)


def _from_agent(
    turn: Turn, event: EventBase, verdict: SecurityVerdictObservation | None = None
) -> None:
    if turn.state.agent_state is AgentState.RATE_LIMITED:
        turn.change_state(AgentState.RUNNING, "the LLM answered", cause=event.id)
    _add_usage(turn, event)
    action = turn.log(event)
    _remember(turn, action)
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
            _from_security(turn, verdict)
    elif isinstance(action, AgentDelegateAction):
        _delegate(turn, action)
    else:  # think, a plain message, a condensation, or an error about a bad LLM reply
        _next_step(turn)


def _delegation_refusal(parent: TaskState, action: AgentDelegateAction) -> str | None:
    """Why the parent may not delegate this, or None. A sub-task's iterations and budget come
    out of what its parent has left, and the tree's depth and each task's fan-out are bounded,
    so that no agent can multiply what its task was given."""
    depth = parent.delegation_depth + 1
    if depth > parent.max_delegation_depth:
        return (
            f"a sub-task here would be {depth} levels deep, past the limit of "
            f"{parent.max_delegation_depth}; do the work in this task"
        )
    if len(parent.sub_tasks) >= parent.max_sub_tasks:
        return (
            f"this task has delegated {len(parent.sub_tasks)} sub-tasks, the most one task may "
            f"({parent.max_sub_tasks}); do the work in this task"
        )
    left = parent.max_iterations - parent.iterations_used()
    if left < 1:
        return "this task has no iterations left to give a sub-task"
    if action.max_iterations is not None and action.max_iterations > left:
        return (
            f"the sub-task asks for {action.max_iterations} iterations, more than this task has "
            f"left ({left}); ask for at most {left}"
        )
    if parent.max_budget_usd is not None:
        budget_left = parent.max_budget_usd - parent.total_usage().cost_usd
        if budget_left <= 0:
            return (
                f"this task's budget (${parent.max_budget_usd:.4f}) is spent: nothing is left "
                "for a sub-task"
            )
    return None


def _delegate(turn: Turn, action: AgentDelegateAction) -> None:
    parent = turn.state
    refusal = _delegation_refusal(parent, action)
    if refusal is not None:
        _count(turn, DELEGATIONS_REFUSED)
        _remember(
            turn,
            turn.log(
                ErrorObservation(
                    task_id=parent.task_id,
                    source=EventSource.ENVIRONMENT,
                    cause=action.id,
                    error_code=DELEGATION_REFUSED,
                    content=f"Delegation refused: {refusal}.",
                )
            ),
        )
        _next_step(turn)
        return
    child_id = sub_task_id(action.id)
    left = parent.max_iterations - parent.iterations_used()
    limit = min(
        action.max_iterations or parent.initial_max_iterations or parent.max_iterations, left
    )
    budget = (
        None
        if parent.max_budget_usd is None
        else parent.max_budget_usd - parent.total_usage().cost_usd
    )
    turn.new_tasks.append(
        TaskState(
            task_id=child_id,
            task=action.task,
            max_iterations=limit,
            initial_max_iterations=limit,
            # The sub-task may spend what its parent has left, and no more: resuming it raises
            # its budget by this amount, which again is the parent's to spend.
            max_budget_usd=budget,
            initial_budget_usd=budget,
            confirmation_mode=parent.confirmation_mode,
            confirmation_threshold=parent.confirmation_threshold,
            network_egress=parent.network_egress,
            workspace_mib=parent.workspace_mib,
            tenant_id=parent.tenant_id,
            priority=parent.priority,
            delegation_depth=parent.delegation_depth + 1,
            max_delegation_depth=parent.max_delegation_depth,
            max_sub_tasks=parent.max_sub_tasks,
            parent_task_id=parent.task_id,
            parent_action_id=action.id,
        )
    )
    turn.update(
        awaiting=Awaiting.DELEGATE, awaiting_id=action.id, sub_tasks=[*parent.sub_tasks, child_id]
    )
    turn.send(
        Service.CONTROLLER,
        MessageAction(task_id=child_id, source=EventSource.USER, content=action.task),
    )


# --- security, runtime, sub-tasks ----------------------------------------------------------


def _needs_confirmation(state: TaskState, risk: RiskLevel) -> bool:
    if not state.confirmation_mode:
        return False
    if risk is RiskLevel.UNKNOWN:
        return True
    return _RISK_ORDER[risk] >= _RISK_ORDER.get(state.confirmation_threshold, 2)


def _execute(state: TaskState, action: RunnableAction) -> ExecuteAction:
    return ExecuteAction(
        task_id=action.task_id,
        action=action,
        network_egress=state.network_egress,
        workspace_mib=state.workspace_mib,
        tenant_id=state.tenant_id,
        priority=state.priority,
    )


def _from_security(turn: Turn, event: EventBase) -> None:
    verdict = turn.log(event)
    action = turn.state.pending_action
    if not isinstance(verdict, SecurityVerdictObservation) or action is None:
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
        _next_step(turn)
        return
    if verdict.verdict is Verdict.DENY:
        _remember(
            turn,
            turn.log(
                ErrorObservation(
                    task_id=event.task_id,
                    source=EventSource.ENVIRONMENT,
                    cause=action.id,
                    error_code=SECURITY_DENIED,
                    content=f"The security monitor denied this action ({verdict.rule}): "
                    f"{verdict.reason}. Choose another way.",
                )
            ),
        )
        turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None)
        _next_step(turn)
    elif _needs_confirmation(turn.state, verdict.risk):
        turn.change_state(
            AgentState.AWAITING_USER_CONFIRMATION,
            f"{verdict.risk.value} risk action needs confirmation",
            cause=action.id,
        )
        turn.update(awaiting=Awaiting.CONFIRMATION)
    else:
        turn.update(
            awaiting=Awaiting.RUNTIME,
            approval=Approval(action_id=action.id, by=ApprovedBy.SECURITY, answer_id=verdict.id),
        )
        turn.send(Service.RUNTIME, _execute(turn.state, action))


def _observed(turn: Turn, event: EventBase) -> None:
    if turn.state.awaiting is Awaiting.RUNTIME:
        # The runtime's answer names the replica whose engine holds the task's sandbox (or
        # none): the task's next orders go to that replica (Turn.outbox).
        turn.update(runtime_replica=getattr(event, "runtime_replica", None))
    _remember(turn, turn.log(event))
    if isinstance(event, AgentDelegateObservation):
        _count_sub_task_spend(turn, event)
        log.info(
            "task %s: sub-task %s ended %s", event.task_id, event.sub_task_id, event.agent_state
        )
    turn.update(
        awaiting=Awaiting.NOTHING,
        awaiting_id=None,
        pending_action=None,
        approval=None,
        requeue_if_queued=False,
    )
    _next_step(turn)


# --- waiting for a sandbox ----------------------------------------------------------------


def _queued(turn: Turn, event: SandboxQueuedObservation) -> None:
    """The action waits for a seat: logged for the user; the runtime runs it once seated.
    After a rebuild, the queue it names may be the one Redis lost (the runtime queued it just
    before the loss): the order is sent again, once (the same action: it runs at most once, and
    queueing it again where it is queued keeps its place)."""
    if turn.state.awaiting is not Awaiting.RUNTIME:
        _count(turn, STALE.labels(event.kind))
        return
    turn.log(event)
    _count(turn, QUEUED)
    if turn.state.requeue_if_queued:
        turn.update(requeue_if_queued=False)
        send_queued_action(turn)


# --- answers that do not come --------------------------------------------------------------

_ANSWERED_BY = {
    Awaiting.AGENT: "the reasoner (the agent's next step)",
    Awaiting.SECURITY: "the security monitor (the review of the action)",
    Awaiting.RUNTIME: "the runtime (the action's result)",
}


def _answer_missing(turn: Turn, event: AnswerMissingObservation) -> None:
    """An overdue answer is asked for again, up to `turn.answer_retries` times; after that, or
    when the order was dead-lettered, the task ends in ERROR naming what did not answer."""
    s = turn.state
    who = _ANSWERED_BY.get(s.awaiting)
    if who is None:
        _count(turn, STALE.labels(event.kind))
        return
    if event.why == "overdue" and s.awaiting_attempt < turn.answer_retries:
        _ask_again(turn)
        return
    if event.why == "overdue":
        reason = f"no answer from {who} after {s.awaiting_attempt + 1} requests"
    else:
        reason = f"{who} gave up on this task's order: {event.detail}"
    turn.update(pending_action=None)
    _fail(turn, reason[:1000])


def _ask_again(turn: Turn) -> None:
    """The same request once more. A step gets a new id (a late answer to the old one is then
    stale); an action keeps its id, so the runtime never runs it twice."""
    s = turn.state
    turn.update(awaiting_attempt=s.awaiting_attempt + 1)
    if s.awaiting is Awaiting.AGENT:
        step = step_request(s, s.iteration)
        turn.update(awaiting_id=step.id)
        turn.send(Service.REASONER, step)
    elif s.pending_action is not None and s.awaiting is Awaiting.SECURITY:
        turn.send(Service.SECURITY, ReviewAction(task_id=s.task_id, action=s.pending_action))
    elif s.pending_action is not None and s.awaiting is Awaiting.RUNTIME:
        turn.send(Service.RUNTIME, _execute(s, s.pending_action))
    _count(turn, RE_REQUESTS.labels(s.awaiting.value))


# --- the next step -------------------------------------------------------------------------


def _next_step(turn: Turn) -> None:
    if turn.state.agent_state is not AgentState.RUNNING:
        return  # paused, waiting for a person, or ended: no new step until resumed
    _request_step(turn)


def _request_step(turn: Turn) -> None:
    state = turn.state
    pattern = detect(state.recent)
    if pattern is not None:
        _count(turn, STUCK)
        _fail(turn, f"stuck in a loop: {pattern}")
        return
    if state.iterations_used() >= state.max_iterations:
        _fail(turn, f"reached the maximum number of iterations ({state.max_iterations})")
        return
    spent = state.total_usage().cost_usd
    if state.max_budget_usd is not None and spent >= state.max_budget_usd:
        _fail(
            turn,
            f"reached the maximum budget (${state.max_budget_usd:.4f}; spent ${spent:.4f})",
        )
        return
    step = step_request(state, state.iteration + 1)
    turn.update(iteration=step.iteration, awaiting=Awaiting.AGENT, awaiting_id=step.id)
    if step.iteration == 1:
        # The sandbox starts while the agent thinks about its first action.
        turn.send(
            Service.RUNTIME,
            PrepareSandbox(
                task_id=state.task_id,
                network_egress=state.network_egress,
                workspace_mib=state.workspace_mib,
                tenant_id=state.tenant_id,
                priority=state.priority,
            ),
        )
    turn.send(Service.REASONER, step)
    _count(turn, STEPS)


def _fail(turn: Turn, reason: str) -> None:
    turn.change_state(AgentState.ERROR, reason)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None, approval=None)
