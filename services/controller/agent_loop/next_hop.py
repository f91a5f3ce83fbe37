"""Where a task goes next, decided here and nowhere else: its next step from the reasoner (with
the sandbox prepared alongside its first), an order to the runtime, or its end. Each message
names its next hop too: a step request tells the reasoner to send a runnable answer by way of
the security monitor (`StepRequest.review_runnable`)."""

from __future__ import annotations

from shared.commands import ExecuteAction, PrepareSandbox, StepRequest
from shared.events import AgentState, EventSource, LoopHintObservation, RunnableAction
from shared.state import Awaiting, TaskState
from shared.subjects import Service

from ..loop_hints import loop_hint
from ..metrics import STEPS, STUCK
from ..stuck import detect
from ..turn import Turn
from .common import count

__all__ = [
    "execute_order",
    "fail",
    "hint_loop",
    "next_step",
    "prepare_order",
    "request_step",
    "step_request",
]


def step_request(state: TaskState, iteration: int) -> StepRequest:
    """The reasoner's order for the step after the log's last entry: the tenant and priority
    say where its LLM call stands among those waiting for the model. A runnable answer goes
    by way of the security monitor: every such action is reviewed before it runs, and reviewed
    on its way the controller takes it and its verdict in one turn instead of two."""
    return StepRequest(
        task_id=state.task_id,
        after_seq=state.last_seq,
        iteration=iteration,
        tenant_id=state.tenant_id,
        priority=state.priority,
        review_runnable=True,
    )


def execute_order(state: TaskState, action: RunnableAction) -> ExecuteAction:
    scope = state.action_scope
    return ExecuteAction(
        task_id=action.task_id,
        action=action,
        network_egress=state.network_egress,
        network=state.network,
        network_scope=scope.network if scope is not None and scope.action_id == action.id else None,
        workspace_mib=state.workspace_mib,
        tenant_id=state.tenant_id,
        priority=state.priority,
        checkpoint_seq=state.checkpoint_seq,
        checkpoint_task=state.checkpoint_task,
        restore_first=state.restore_first,
        checkpoint_due=state.checkpoint_due,
    )


def prepare_order(state: TaskState) -> PrepareSandbox:
    """The runtime's order to get the task's sandbox ready while the agent thinks."""
    return PrepareSandbox(
        task_id=state.task_id,
        network_egress=state.network_egress,
        network=state.network,
        workspace_mib=state.workspace_mib,
        tenant_id=state.tenant_id,
        priority=state.priority,
    )


def next_step(turn: Turn) -> None:
    if turn.state.agent_state is not AgentState.RUNNING:
        return  # paused, waiting for a person, or ended: no new step until resumed
    request_step(turn)


def request_step(turn: Turn) -> None:
    state = turn.state
    pattern = detect(state.recent, turn.loop.repeats)
    if pattern is not None:
        count(turn, STUCK)
        if state.loop_hints >= turn.loop.hints:
            after = " (it went on after the agent was told)" if state.loop_hints else ""
            fail(turn, f"stuck in a loop: {pattern}{after}")
            return
        hint_loop(turn, pattern)
        state = turn.state  # the next step sees the hint
    if state.iterations_used() >= state.max_iterations:
        fail(turn, f"reached the maximum number of iterations ({state.max_iterations})")
        return
    spent = state.total_usage().cost_usd
    if state.max_budget_usd is not None and spent >= state.max_budget_usd:
        fail(
            turn,
            f"reached the maximum budget (${state.max_budget_usd:.4f}; spent ${spent:.4f})",
        )
        return
    step = step_request(state, state.iteration + 1)
    turn.update(iteration=step.iteration, awaiting=Awaiting.AGENT, awaiting_id=step.id)
    if step.iteration == 1:
        # The sandbox starts while the agent thinks about its first action.
        turn.send(Service.RUNTIME, prepare_order(state))
    turn.send(Service.REASONER, step)
    count(turn, STEPS)


def hint_loop(turn: Turn, pattern: str) -> None:
    """The agent is told what repeats and how it might get out; the loop must form again,
    from now on, to count (past the hints it ends the task)."""
    given = turn.state.loop_hints + 1
    turn.log(
        LoopHintObservation(
            task_id=turn.state.task_id,
            source=EventSource.ENVIRONMENT,
            pattern=pattern,
            hint=loop_hint(pattern, turn.logged),
            hints_given=given,
        )
    )
    turn.update(loop_hints=given, recent=[])


def fail(turn: Turn, reason: str) -> None:
    turn.change_state(AgentState.ERROR, reason)
    turn.update(awaiting=Awaiting.NOTHING, awaiting_id=None, pending_action=None, approval=None)
