"""A task's creation: the gateway asks, the controller makes its State (issue 26, item 4).

The gateway does not write a task's State. It sends the controller a TaskCreatedObservation
carrying the task's text (`creation_request`) on the task's own work subject; the controller
makes the State from it (`state_from_created`), logs the same entry without the text (the log's
first entry, `created_entry`; the text is the next one, the first user message) and takes the
first message (`first_message`) in the same turn. Both sides build the same State from the same
request with these functions, so the gateway can show a task the controller has not made yet
(`deckhands:task-creation:<id>`, `creation_key`) exactly as the controller will make it.
"""

from __future__ import annotations

import uuid

from redis.asyncio import Redis

from .events import AgentState, EventSource, MessageAction, TaskCreatedObservation
from .forks import checkpoint_name, parse_checkpoint
from .state import TaskState

__all__ = [
    "CREATION_KEPT_S",
    "CREATION_REQUEST",
    "UNQUEUED",
    "created_entry",
    "creation_key",
    "creation_request",
    "derived_event_id",
    "first_message",
    "requested",
    "state_from_created",
]

# How long the gateway keeps a creation request it sent, for showing the task until the
# controller has made its State (normally milliseconds; a controller down for hours too).
CREATION_KEPT_S = 7 * 86_400
# The fields of a kept request (a hash): the request as JSON, and why it could not be queued.
CREATION_REQUEST = "request"
UNQUEUED = "unqueued"
_ID_NAMESPACE = uuid.UUID("6f1f3c52-7d1e-4d8a-9a57-1c1f0d2a9b10")


def derived_event_id(*parts: str) -> str:
    """A stable event id: publishing it again is dropped by JetStream's Nats-Msg-Id dedup and
    recognised by the controller, so a retried request cannot queue the same input twice."""
    return uuid.uuid5(_ID_NAMESPACE, "\x1f".join(parts)).hex


def creation_key(task_id: str) -> str:
    """The gateway's copy of the creation request it sent, until the State exists."""
    return f"deckhands:task-creation:{task_id}"


async def requested(redis: Redis, task_id: str) -> bool:
    """Whether the gateway sent a request to make the task (and could queue it)."""
    request, unqueued = await redis.hmget(creation_key(task_id), [CREATION_REQUEST, UNQUEUED])
    return request is not None and unqueued is None


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
        network=state.network,
        workspace_mib=state.workspace_mib,
        tenant_id=state.tenant_id,
        priority=state.priority,
        delegation_depth=state.delegation_depth,
        max_delegation_depth=state.max_delegation_depth,
        max_sub_tasks=state.max_sub_tasks,
        parent_task_id=state.parent_task_id,
        parent_action_id=state.parent_action_id,
        forked_from=state.forked_from,
        forked_at=state.forked_at,
        fork_checkpoint=(
            checkpoint_name(state.checkpoint_task, state.checkpoint_seq)
            if state.forked_from and state.checkpoint_task and state.checkpoint_seq
            else None
        ),
    )


def creation_request(state: TaskState) -> TaskCreatedObservation:
    """What the gateway sends the controller to make `state` (a task not yet started)."""
    return created_entry(state).model_copy(update={"task": state.task})


def state_from_created(created: TaskCreatedObservation, task: str | None = None) -> TaskState:
    """The State of a task not yet started, as `created` describes it. `task` is its text when
    `created` does not carry it (a log entry: the text is the first user message)."""
    checkpoint_task, checkpoint_seq = (
        parse_checkpoint(created.fork_checkpoint) if created.fork_checkpoint else (None, None)
    )
    return TaskState(
        task_id=created.task_id,
        task=(created.task or "") if task is None else task,
        created_at=created.created_at,
        updated_at=created.created_at,
        agent_state=AgentState.LOADING,
        max_iterations=created.max_iterations,
        initial_max_iterations=created.initial_max_iterations,
        max_budget_usd=created.max_budget_usd,
        initial_budget_usd=created.initial_budget_usd,
        confirmation_mode=created.confirmation_mode,
        confirmation_threshold=created.confirmation_threshold,
        network_egress=created.network_egress,
        network=created.network,
        workspace_mib=created.workspace_mib,
        tenant_id=created.tenant_id,
        priority=created.priority,
        delegation_depth=created.delegation_depth,
        max_delegation_depth=created.max_delegation_depth,
        max_sub_tasks=created.max_sub_tasks,
        parent_task_id=created.parent_task_id,
        parent_action_id=created.parent_action_id,
        forked_from=created.forked_from,
        forked_at=created.forked_at,
        checkpoint_task=checkpoint_task,
        checkpoint_seq=checkpoint_seq,
    )


def first_message(created: TaskCreatedObservation) -> MessageAction:
    """The task's text as its first user message. Its id is the one the gateway gave the first
    message before the controller made States, so a task's log reads the same either way."""
    return MessageAction(
        id=derived_event_id(created.task_id, "initial-message"),
        task_id=created.task_id,
        source=EventSource.USER,
        timestamp=created.timestamp,
        content=created.task or "",
    )
