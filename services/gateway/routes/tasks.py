"""HTTP routes of /v1/tasks: create, list, read, delete, and user input (messages, stop, pause,
resume, confirmation). Logic lives in TaskService, TaskListing and TaskDeletion."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header, Query, Response, status

from shared.events import AgentState

from ..context import TaskDeletionDep, TaskForksDep, TaskListingDep, TaskServiceDep
from ..http.auth import CallerDep
from ..http.models import ErrorResponse, InvalidRequestResponse, QuotaExceededResponse
from ..tasks.fork_models import ForkRequest, ForksCreated, RewindRequest
from ..tasks.forks import ForkSpec
from ..tasks.listing import TaskQuery
from ..tasks.models import (
    MAX_LABELS,
    AcceptedEvent,
    ConfirmationRequest,
    CreateTaskRequest,
    Label,
    MessageRequest,
    TaskCreated,
    TaskList,
    TaskSummary,
    TaskView,
)
from ..tasks.values import NewTask

__all__ = ["router"]

Responses = dict[int | str, dict[str, Any]]

UNAUTHORIZED: Responses = {
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"}
}

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], responses=UNAUTHORIZED)

_NOT_FOUND: Responses = {
    404: {"model": ErrorResponse, "description": "No such task of the caller's tenant"}
}
_UNAVAILABLE: Responses = {
    503: {"model": ErrorResponse, "description": "NATS or Redis unavailable; retry"}
}
_TOO_LARGE: Responses = {
    413: {
        "model": ErrorResponse,
        "description": "The body is over DECKHANDS_MAX_REQUEST_BODY_BYTES, or what it asks to "
        "send would not fit in one broker message; the detail names the size and the limit",
    }
}
_INVALID: Responses = {
    422: {
        "model": InvalidRequestResponse,
        "description": "An invalid field (each named), an egress policy outside what the "
        "operator allows or an unknown preset (the rule or preset named), or an "
        "Idempotency-Key reused for another request",
    }
}
_OVER_QUOTA: Responses = {
    429: {
        "model": QuotaExceededResponse,
        "description": "One of the tenant's quotas is reached (running tasks, sandboxes, spend "
        "per day): the body names it; retry after Retry-After seconds",
    }
}
_CONTROL_RESPONSES: Responses = {**_NOT_FOUND, **_UNAVAILABLE, **_INVALID}
_INPUT_RESPONSES: Responses = {**_CONTROL_RESPONSES, **_TOO_LARGE}

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        description="Repeat a request with the same key to get the same result, not a second one.",
    ),
]


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TaskCreated,
    responses={
        **_TOO_LARGE,
        **_INVALID,
        **_OVER_QUOTA,
        503: {
            "model": ErrorResponse,
            "description": "NATS or Redis unavailable, or this gateway is creating as many "
            "tasks at once as it takes (DECKHANDS_MAX_CREATIONS_IN_FLIGHT): nothing was "
            "created; retry after Retry-After",
        },
        403: {
            "model": ErrorResponse,
            "description": "Network egress asked for, but neither this server nor the "
            "tenant allows any; or a "
            "trajectory, which the operator has not allowed this tenant; or secrets or a "
            "webhook when this server's secrets are off",
        },
    },
    summary="Create a task and start its agent",
)
async def create_task(
    body: CreateTaskRequest,
    tasks: TaskServiceDep,
    caller: CallerDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> TaskCreated:
    new = NewTask(
        task=body.task,
        max_iterations=body.max_iterations,
        max_budget_usd=body.max_budget_usd,
        confirmation_mode=body.confirmation_mode,
        confirmation_threshold=body.confirmation_threshold,
        network_egress=body.network_egress,
        network_allow=tuple(body.network.allow) if body.network is not None else (),
        network_presets=tuple(body.network.presets) if body.network is not None else (),
        network_between_actions=(
            tuple(body.network.between_actions) if body.network is not None else ()
        ),
        workspace_mib=body.workspace_mib,
        trajectory=body.trajectory,
        labels=tuple(body.labels),
        repository=body.repository.model_dump() if body.repository is not None else None,
        secrets=tuple(body.secrets),
        webhook=body.webhook,
        priority=body.priority,
    )
    created = await tasks.create(new, caller.tenant_id, idempotency_key)
    response.headers["Location"] = f"/v1/tasks/{created.state.task_id}"
    if created.replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return TaskCreated(id=created.state.task_id, state=created.state.agent_state)


@router.post(
    "/{task_id}/fork",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ForksCreated,
    responses={
        **_CONTROL_RESPONSES,
        **_OVER_QUOTA,
        409: {
            "model": ErrorResponse,
            "description": "The files of that point were not kept (a checkpoint after it was "
            "skipped: too large, over quota), the task is a sub-task, or it has not started",
        },
        410: {
            "model": ErrorResponse,
            "description": "The checkpoint of that point is no longer kept (past "
            "DECKHANDS_CHECKPOINT_RETENTION_S)",
        },
    },
    summary="Fork a task at a seq of its log into new tasks, each with its files of then",
)
async def fork_task(
    task_id: str,
    body: ForkRequest,
    forks: TaskForksDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
) -> ForksCreated:
    spec = ForkSpec(
        at=body.at,
        count=body.count,
        message=body.message,
        labels=tuple(body.labels),
        max_iterations=body.limits.max_iterations,
        max_budget_usd=body.limits.max_budget_usd,
        priority=body.limits.priority,
    )
    made = await forks.fork(task_id, caller.tenant_id, spec, idempotency_key)
    return ForksCreated(
        forked_from=task_id,
        at=body.at,
        checkpoint=made.files.checkpoint,
        forks=[TaskCreated(id=c.state.task_id, state=c.state.agent_state) for c in made.created],
    )


@router.post(
    "/{task_id}/rewind",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=AcceptedEvent,
    responses={
        **_CONTROL_RESPONSES,
        409: {
            "model": ErrorResponse,
            "description": "The task runs (pause it first) or was stopped (fork it instead), "
            "is a sub-task, or the files of that point were not kept",
        },
        410: {
            "model": ErrorResponse,
            "description": "The checkpoint of that point is no longer kept",
        },
    },
    summary="Take a paused or ended task back to a seq of its log, files included",
)
async def rewind_task(
    task_id: str,
    body: RewindRequest,
    forks: TaskForksDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
) -> AcceptedEvent:
    event = await forks.rewind(task_id, caller.tenant_id, body.to, idempotency_key)
    return AcceptedEvent(task_id=task_id, event_id=event.id, kind=event.kind)


@router.get(
    "/{task_id}", response_model=TaskView, responses=_CONTROL_RESPONSES, summary="A task's state"
)
async def get_task(task_id: str, tasks: TaskServiceDep, caller: CallerDep) -> TaskView:
    owned, sub_tasks = await tasks.get_with_sub_tasks(task_id, caller.tenant_id)
    place = await tasks.queue_place(owned.state)
    return TaskView.from_state(owned.state, sub_tasks, place, owned.labels)


@router.get(
    "",
    response_model=TaskList,
    responses={**_UNAVAILABLE, **_INVALID},
    summary="The caller's tasks, newest first, a page at a time",
)
async def list_tasks(
    listing: TaskListingDep,
    caller: CallerDep,
    state: Annotated[
        list[AgentState] | None, Query(description="Only tasks in one of these states.")
    ] = None,
    label: Annotated[
        list[Label] | None,
        Query(max_length=MAX_LABELS, description="Only tasks carrying every one of these labels."),
    ] = None,
    created_after: Annotated[
        datetime | None, Query(description="Only tasks created after this time (ISO 8601).")
    ] = None,
    created_before: Annotated[
        datetime | None, Query(description="Only tasks created before this time (ISO 8601).")
    ] = None,
    forked_from: Annotated[
        str | None,
        Query(max_length=128, description="Only the forks of this task (POST .../fork)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[
        str | None,
        Query(max_length=256, description="`next_cursor` of the previous page, as it is."),
    ] = None,
) -> TaskList:
    query = TaskQuery(
        limit=limit,
        cursor=cursor,
        states=frozenset(state or ()),
        labels=frozenset(label or ()),
        created_after=created_after,
        created_before=created_before,
        forked_from=forked_from,
    )
    page = await listing.page(caller.tenant_id, query)
    return TaskList(
        tasks=[TaskSummary.of(s, labels) for s, labels in page.tasks],
        next_cursor=page.next_cursor,
    )


@router.delete(
    "/{task_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={
        **_NOT_FOUND,
        409: {"model": ErrorResponse, "description": "A sub-task: delete its root task"},
        502: {"model": ErrorResponse, "description": "The storage service answered wrongly"},
        503: {
            "model": ErrorResponse,
            "description": "The task did not stop in time, or NATS, Redis or storage is "
            "unavailable; retry (what was removed stays removed)",
        },
    },
    summary="Stop the task if need be, and remove it: State, log, blobs, sub-tasks",
)
async def delete_task(task_id: str, deletion: TaskDeletionDep, caller: CallerDep) -> Response:
    await deletion.delete(task_id, caller.tenant_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


def _accepted(task_id: str, event_id: str, kind: str) -> AcceptedEvent:
    return AcceptedEvent(task_id=task_id, event_id=event_id, kind=kind)


@router.post(
    "/{task_id}/messages",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=AcceptedEvent,
    responses={**_INPUT_RESPONSES, **_OVER_QUOTA},
    summary="Send a user message to the task's agent (also resumes a waiting task)",
)
async def send_message(
    task_id: str,
    body: MessageRequest,
    tasks: TaskServiceDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
) -> AcceptedEvent:
    event = await tasks.send_message(
        task_id, body.content, caller.tenant_id, idempotency_key, body.network
    )
    return _accepted(task_id, event.id, "message")


async def _change_state(
    tasks: TaskServiceDep,
    caller: CallerDep,
    task_id: str,
    agent_state: AgentState,
    reason: str,
    idempotency_key: str | None,
) -> AcceptedEvent:
    event = await tasks.change_state(
        task_id,
        agent_state,
        reason,
        tenant_id=caller.tenant_id,
        idempotency_key=idempotency_key,
    )
    return _accepted(task_id, event.id, "change_agent_state")


_Route = TypeVar("_Route", bound=Callable[..., Any])


def _control_route(path: str, summary: str) -> Callable[[_Route], _Route]:
    return router.post(
        path,
        status_code=status.HTTP_202_ACCEPTED,
        response_model=AcceptedEvent,
        responses=_INPUT_RESPONSES,
        summary=summary,
    )


@_control_route("/{task_id}/stop", "Stop the task for good")
async def stop_task(
    task_id: str, tasks: TaskServiceDep, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> AcceptedEvent:
    return await _change_state(
        tasks, caller, task_id, AgentState.STOPPED, "stopped by user", idempotency_key
    )


@_control_route("/{task_id}/pause", "Pause the task")
async def pause_task(
    task_id: str, tasks: TaskServiceDep, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> AcceptedEvent:
    return await _change_state(
        tasks, caller, task_id, AgentState.PAUSED, "paused by user", idempotency_key
    )


@_control_route("/{task_id}/resume", "Resume a paused task")
async def resume_task(
    task_id: str, tasks: TaskServiceDep, caller: CallerDep, idempotency_key: IdempotencyKey = None
) -> AcceptedEvent:
    return await _change_state(
        tasks, caller, task_id, AgentState.RUNNING, "resumed by user", idempotency_key
    )


@_control_route("/{task_id}/confirmation", "Approve or reject the action awaiting confirmation")
async def confirm_action(
    task_id: str,
    body: ConfirmationRequest,
    tasks: TaskServiceDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
) -> AcceptedEvent:
    # OpenHands' convention: the answer is a state change whose cause is the action answered.
    agent_state = AgentState.USER_CONFIRMED if body.approve else AgentState.USER_REJECTED
    event = await tasks.change_state(
        task_id,
        agent_state,
        "confirmed by user" if body.approve else "rejected by user",
        tenant_id=caller.tenant_id,
        cause=body.action_id,
        idempotency_key=idempotency_key,
    )
    return _accepted(task_id, event.id, "change_agent_state")
