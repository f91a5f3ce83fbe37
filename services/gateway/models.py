"""Request and response bodies of HTTP API v1."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.events import AgentState
from shared.state import TaskState

__all__ = [
    "AcceptedEvent",
    "ConfirmationRequest",
    "CreateTaskRequest",
    "EventPage",
    "MessageRequest",
    "ReadinessReport",
    "TaskCreated",
    "TaskResultView",
    "TaskUsageView",
    "TaskView",
    "Trajectory",
]

_MAX_TEXT = 200_000  # well under NATS' 1 MB payload limit once wrapped in an event


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    return value


class _Request(BaseModel):
    # A misspelt field is a client bug: say so instead of silently ignoring it.
    model_config = ConfigDict(extra="forbid")


class CreateTaskRequest(_Request):
    task: str = Field(min_length=1, max_length=_MAX_TEXT, description="What the agent should do.")
    max_iterations: int | None = Field(
        default=None, ge=1, le=1000, description="Iteration limit; the server default if absent."
    )

    _task_not_blank = field_validator("task")(_not_blank)


class MessageRequest(_Request):
    content: str = Field(min_length=1, max_length=_MAX_TEXT)

    _content_not_blank = field_validator("content")(_not_blank)


class ConfirmationRequest(_Request):
    action_id: str = Field(
        min_length=1, max_length=128, description="Id of the action awaiting confirmation."
    )
    approve: bool


class TaskCreated(BaseModel):
    id: str
    state: AgentState


class AcceptedEvent(BaseModel):
    """An event the gateway queued for the controller; the controller decides what it does."""

    task_id: str
    event_id: str
    kind: str


class TaskUsageView(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    cost_usd: float
    llm_calls: int


class TaskResultView(BaseModel):
    final_message: str
    outputs: dict[str, Any]


class TaskView(BaseModel):
    id: str
    task: str
    state: AgentState
    reason: str
    iterations: int
    max_iterations: int
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    usage: TaskUsageView
    result: TaskResultView | None = Field(description="Present once the task has finished.")

    @classmethod
    def from_state(cls, state: TaskState) -> TaskView:
        usage = state.usage
        result = state.result
        return cls(
            id=state.task_id,
            task=state.task,
            state=state.agent_state,
            reason=state.reason,
            iterations=state.iteration,
            max_iterations=state.max_iterations,
            created_at=state.created_at,
            updated_at=state.updated_at,
            finished_at=state.finished_at,
            usage=TaskUsageView(
                prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens,
                total_tokens=usage.prompt_tokens + usage.completion_tokens,
                cost_usd=usage.cost_usd,
                llm_calls=usage.llm_calls,
            ),
            result=None
            if result is None
            else TaskResultView(final_message=result.final_message, outputs=result.outputs),
        )


class EventPage(BaseModel):
    task_id: str
    events: list[dict[str, Any]] = Field(
        description="Events in seq order; each is one kind of the Event union (field `kind`)."
    )
    next_after: int = Field(description="Pass as `after` to get the next page.")
    last_seq: int = Field(description="Highest seq stored for the task so far.")
    has_more: bool


class Trajectory(BaseModel):
    task_id: str
    task: str
    events: list[dict[str, Any]]


class ReadinessReport(BaseModel):
    ready: bool
    checks: dict[str, str] = Field(description="'ok' or what failed, per dependency.")
