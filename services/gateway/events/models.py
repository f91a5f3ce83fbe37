"""Response bodies of a task's events: a page of its log, its whole trajectory."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["EventPage", "Trajectory"]


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
