"""Sub-tasks: a delegation made (or refused, past the limits), and what sub-tasks report."""

from __future__ import annotations

import uuid

from shared.events import (
    AgentDelegateAction,
    AgentDelegateObservation,
    ErrorObservation,
    EventBase,
    EventSource,
    MessageAction,
)
from shared.state import Awaiting, TaskState
from shared.subjects import Service

from ..metrics import DELEGATIONS_REFUSED
from ..turn import Turn
from .common import DELEGATION_REFUSED, count, remember
from .next_hop import next_step

__all__ = [
    "answers_delegation",
    "count_sub_task_spend",
    "delegate",
    "sub_task_id",
]

_SUB_TASK_NS = uuid.UUID("0b6f3c1e-8a4d-4c5e-9f2a-7d1e3b5c9a80")


def sub_task_id(delegate_action_id: str) -> str:
    """Derived from the action, so a redelivered delegation names the same sub-task."""
    return uuid.uuid5(_SUB_TASK_NS, delegate_action_id).hex


def answers_delegation(state: TaskState, event: EventBase) -> bool:
    return (
        event.cause is not None
        and event.cause == state.awaiting_id
        and (state.awaiting is Awaiting.DELEGATE)
    )


def count_sub_task_spend(turn: Turn, event: AgentDelegateObservation) -> None:
    """Keep the sub-task's latest (cumulative) report; only this task's own sub-tasks count."""
    if event.spent is None or event.sub_task_id not in turn.state.sub_tasks:
        return
    turn.update(sub_task_spend={**turn.state.sub_task_spend, event.sub_task_id: event.spent})


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


def delegate(turn: Turn, action: AgentDelegateAction) -> None:
    parent = turn.state
    refusal = _delegation_refusal(parent, action)
    if refusal is not None:
        count(turn, DELEGATIONS_REFUSED)
        remember(
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
        next_step(turn)
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
            network=parent.network,
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
