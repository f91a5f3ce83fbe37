"""Request and response bodies of POST /v1/tasks/{id}/fork (issue 28, item 2)."""

from __future__ import annotations

from pydantic import BaseModel, Field, field_validator

from shared.events import TaskPriority

from ..http.models import ApiRequest
from .models import MAX_LABELS, Label, TaskCreated

__all__ = ["MAX_FORKS", "ForkLimits", "ForkRequest", "ForksCreated", "RewindRequest"]

MAX_FORKS = 32  # one request's forks: each is a task (a seat, a sandbox, its quota)
_MAX_MESSAGE = 200_000


class ForkLimits(ApiRequest):
    """A fork's own limits; absent, the parent's."""

    max_iterations: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="The fork's iteration limit, counting the parent's iterations up to the "
        "fork point (they are in its history); absent: the parent's.",
    )
    max_budget_usd: float | None = Field(
        default=None,
        gt=0,
        le=10_000,
        description="The fork's LLM spend limit, the parent's spend up to the fork point "
        "included; absent: the parent's.",
    )
    priority: TaskPriority | None = Field(
        default=None, description="interactive or batch; absent: the parent's."
    )


class ForkRequest(ApiRequest):
    at: int = Field(
        ge=1,
        description="The seq of the parent's log to fork at: each fork starts with the log up "
        "to it (the whole turn holding it; a point where an action is under review, awaits "
        "confirmation or runs is the step before that action) and /workspace as it was then.",
    )
    count: int = Field(default=1, ge=1, le=MAX_FORKS, description="How many forks to make.")
    message: str | None = Field(
        default=None,
        min_length=1,
        max_length=_MAX_MESSAGE,
        description="Each fork's next user message; absent: the agent goes on from the point.",
    )
    labels: list[Label] = Field(
        default_factory=list, max_length=MAX_LABELS, description="The forks' labels."
    )
    limits: ForkLimits = Field(default_factory=ForkLimits)

    @field_validator("message")
    @classmethod
    def _message_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty or only whitespace")
        return value

    @field_validator("labels")
    @classmethod
    def _labels_are_distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("labels must be distinct")
        return value


class ForksCreated(BaseModel):
    forked_from: str
    at: int = Field(description="The seq asked for (each fork starts from its whole turn).")
    checkpoint: str | None = Field(
        description="The checkpoint their /workspace starts from; null: an empty one."
    )
    forks: list[TaskCreated]


class RewindRequest(ApiRequest):
    to: int = Field(
        ge=1,
        description="The seq of the task's log to go back to (the whole turn holding it; a "
        "point where an action was in flight is the step before it). The log keeps what came "
        "after; /workspace gets the files of then back before the next action.",
    )
