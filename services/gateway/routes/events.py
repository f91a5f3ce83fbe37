"""HTTP routes of a task's events: pages, the trajectory, and the live SSE stream."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from shared.commands import MAX_SEQ

from ..context import EventServiceDep
from ..events.models import EventPage, Trajectory
from ..events.stream import EventStream
from ..http.auth import CallerDep
from ..http.models import ErrorResponse
from ..http.sse import SSE_HEADERS

__all__ = ["router"]

router = APIRouter(prefix="/v1/tasks", tags=["events"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
    404: {"model": ErrorResponse, "description": "No such task of the caller's tenant"},
    502: {"model": ErrorResponse, "description": "The storage service answered with an error"},
    503: {
        "model": ErrorResponse,
        "description": "The storage service did not answer in time, or (the trajectory) has "
        "not yet stored the task's whole log",
    },
}


@router.get(
    "/{task_id}/events",
    response_model=EventPage,
    responses=_ERRORS,
    summary="The task's events with seq > after, in order",
)
async def list_events(
    task_id: str,
    events: EventServiceDep,
    caller: CallerDep,
    after: Annotated[
        int, Query(ge=0, le=MAX_SEQ, description="Return events with seq greater than this.")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> EventPage:
    return await events.page(task_id, caller.tenant_id, after, limit)


@router.get(
    "/{task_id}/trajectory",
    response_model=Trajectory,
    responses=_ERRORS,
    summary="The whole event log of the task, for replay and debugging",
)
async def get_trajectory(task_id: str, events: EventServiceDep, caller: CallerDep) -> Trajectory:
    return await events.trajectory(task_id, caller.tenant_id)


@router.get(
    "/{task_id}/events/stream",
    responses={
        200: {
            "description": "Server-Sent Events: `id: <seq>`, `event: <kind>`, `data: <event JSON>`",
            "content": {"text/event-stream": {}},
        },
        **_ERRORS,
        429: {
            "model": ErrorResponse,
            "description": "This client already holds DECKHANDS_MAX_EVENT_STREAMS_PER_CLIENT "
            "event streams",
        },
    },
    response_class=StreamingResponse,
    summary="Live events; resumable with Last-Event-ID",
)
async def stream_events(
    task_id: str,
    events: EventServiceDep,
    caller: CallerDep,
    request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Start after this seq.")] = 0,
    close_on_terminal: Annotated[
        bool, Query(description="End the stream after the task reaches a terminal state.")
    ] = False,
    last_event_id: Annotated[
        int | None,
        Header(
            alias="Last-Event-ID",
            ge=0,
            le=MAX_SEQ,
            description="Resume after this seq (wins over after).",
        ),
    ] = None,
) -> StreamingResponse:
    start = last_event_id if last_event_id is not None else after
    client = request.client.host if request.client else "unknown"
    stream = await events.open_stream(
        task_id,
        start,
        tenant_id=caller.tenant_id,
        client=client,
        close_on_terminal=close_on_terminal,
    )
    return _EventStreamResponse(stream)


class _EventStreamResponse(StreamingResponse):
    """Closes its stream however the response ends: a client that leaves before the first
    frame ends the response without ever starting `frames()`, whose own clean-up then never
    runs (the stream would keep its subscription and its client's slot)."""

    def __init__(self, stream: EventStream) -> None:
        super().__init__(stream.frames(), media_type="text/event-stream", headers=SSE_HEADERS)
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._stream.close()
