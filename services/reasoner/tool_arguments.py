"""The arguments each built-in tool takes, checked: a model per tool (TOOL_ARGUMENTS)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["TOOL_ARGUMENTS"]


class _Args(BaseModel):
    # Extra arguments are ignored: small models add some, and they change nothing.
    model_config = ConfigDict(extra="ignore")


class _ExecuteBash(_Args):
    command: str
    timeout: float | None = Field(default=None, gt=0, le=3600)
    is_input: bool = False

    @model_validator(mode="after")
    def _command_unless_input(self) -> _ExecuteBash:
        # An empty input is meaningful (wait for more output); an empty command is not.
        if not self.command and not self.is_input:
            raise ValueError("command must not be empty")
        return self


class _ExecutePython(_Args):
    code: str = Field(min_length=1)


class _ReadFile(_Args):
    path: str = Field(min_length=1)
    start_line: int = Field(default=1, ge=1)
    end_line: int | None = Field(default=None, ge=1)


class _WriteFile(_Args):
    path: str = Field(min_length=1)
    content: str


class _EditFile(_Args):
    command: Literal["view", "create", "str_replace", "insert", "undo"]
    path: str = Field(min_length=1)
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = Field(default=None, ge=0)
    view_range: list[int] | None = Field(default=None, min_length=2, max_length=2)


class _Glob(_Args):
    pattern: str = Field(min_length=1, max_length=1000)
    path: str = Field(default="", max_length=4096)


class _Grep(_Args):
    pattern: str = Field(min_length=1, max_length=1000)
    path: str = Field(default="", max_length=4096)
    include: str = Field(default="", max_length=1000)


class _ApplyPatch(_Args):
    patch: str = Field(min_length=1, max_length=1_000_000)


class _PlanItem(_Args):
    title: str = Field(min_length=1, max_length=500)
    status: Literal["todo", "in_progress", "done"] = "todo"
    notes: str = Field(default="", max_length=2000)


class _TaskTracker(_Args):
    command: Literal["plan", "view"]
    tasks: list[_PlanItem] = Field(default_factory=list, max_length=100)


class _Think(_Args):
    thought: str


class _Delegate(_Args):
    task: str = Field(min_length=1)
    max_iterations: int | None = Field(default=None, ge=1, le=1000)


class _Finish(_Args):
    message: str
    outputs: dict[str, Any] = Field(default_factory=dict)


TOOL_ARGUMENTS: dict[str, type[_Args]] = {
    "execute_bash": _ExecuteBash,
    "execute_python": _ExecutePython,
    "read_file": _ReadFile,
    "write_file": _WriteFile,
    "edit_file": _EditFile,
    "glob": _Glob,
    "grep": _Grep,
    "apply_patch": _ApplyPatch,
    "task_tracker": _TaskTracker,
    "think": _Think,
    "delegate": _Delegate,
    "finish": _Finish,
}
