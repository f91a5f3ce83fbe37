"""The V1 tools hosted models are trained on (issue 29, item 4), as actions: finding files
(glob), searching them (grep), a unified diff applied atomically (apply_patch), and the agent's
plan (task_tracker). The first three run in the task's sandbox like a command; the plan is the
log's alone."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .actions import _AgentActionFields

__all__ = ["ApplyPatchAction", "GlobAction", "GrepAction", "PlanItem", "TaskTrackerAction"]


class GlobAction(_AgentActionFields):
    """Files whose path matches `pattern` (`**/*.py`), under `path`; what .gitignore names and
    .git left out, newest first, bounded."""

    kind: Literal["glob"] = "glob"
    pattern: str = Field(min_length=1, max_length=1000)
    path: str = Field(default="", max_length=4096, description="A folder; '' for /workspace.")


class GrepAction(_AgentActionFields):
    """Lines matching the regular expression `pattern` in the files under `path` (only those
    matching `include`, a glob, if given); what .gitignore names and .git left out, bounded."""

    kind: Literal["grep"] = "grep"
    pattern: str = Field(min_length=1, max_length=1000)
    path: str = Field(default="", max_length=4096, description="A folder or file; '' for all.")
    include: str = Field(default="", max_length=1000, description="Only files matching this.")


class ApplyPatchAction(_AgentActionFields):
    """A unified diff applied to /workspace atomically: every hunk of every file, or nothing
    and an error naming the hunk that did not apply."""

    kind: Literal["apply_patch"] = "apply_patch"
    patch: str = Field(min_length=1, max_length=1_000_000)


class PlanItem(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str = Field(min_length=1, max_length=500)
    status: Literal["todo", "in_progress", "done"] = "todo"
    notes: str = Field(default="", max_length=2000)


class TaskTrackerAction(_AgentActionFields):
    """The agent's plan: `plan` sets the whole list, `view` shows it. Nothing runs; the console
    and the CLI show the task's latest plan."""

    kind: Literal["task_tracker"] = "task_tracker"
    command: Literal["plan", "view"] = "plan"
    tasks: list[PlanItem] = Field(default_factory=list, max_length=100)
