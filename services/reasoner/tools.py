"""The agent's tools: their function-calling schemas, and the Action each call becomes.

A tool call is validated here; anything wrong with it (unknown tool, arguments that are not JSON,
a missing or mistyped argument) raises `BadReply`, which the reasoner turns into an
ErrorObservation the model sees on its next step.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from shared.events import (
    AgentDelegateAction,
    AgentFinishAction,
    AgentThinkAction,
    CmdRunAction,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    MCPCallAction,
    RunPythonAction,
)
from shared.mcp_config import McpTool, function_name

from .errors import BadReply

__all__ = [
    "TOOL_ARGUMENTS",
    "TOOL_NAMES",
    "TOOL_SPECS",
    "AgentToolAction",
    "ToolCall",
    "action_for_call",
    "call_for_action",
    "describe_tools",
    "offer_mcp_tools",
    "tool_offered",
    "withhold_tools",
]

AgentToolAction = (
    AgentDelegateAction
    | CmdRunAction
    | RunPythonAction
    | FileReadAction
    | FileWriteAction
    | FileEditAction
    | AgentThinkAction
    | AgentFinishAction
    | MCPCallAction
)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str | dict[str, Any]  # as received: a JSON string (native) or an object (text)
    id: str | None = None


def _fn(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


# Short descriptions on purpose: small local models pay for every prompt token. The order is
# the one a task is mostly done in (run, write, read, edit); a Python snippet comes after the
# file tools, since a small model asked for "a Python script" otherwise runs a snippet.
TOOL_SPECS: list[dict[str, Any]] = [
    _fn(
        "execute_bash",
        "Run a bash command in the sandbox (cwd /workspace). Returns output and exit code.",
        {
            "command": {"type": "string", "description": "The command line."},
            "timeout": {"type": "number", "description": "Seconds before it is stopped."},
            "is_input": {
                "type": "boolean",
                "description": "Send `command` to the still-running command ('C-c' stops it).",
            },
        },
        ["command"],
    ),
    _fn(
        "write_file",
        "Create or overwrite a file with exactly the given content (end each line, the last "
        "too, with a newline).",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _fn(
        "read_file",
        "Read a text file, optionally only lines start_line..end_line (1-based, inclusive).",
        {
            "path": {"type": "string"},
            "start_line": {"type": "integer"},
            "end_line": {"type": "integer"},
        },
        ["path"],
    ),
    _fn(
        "edit_file",
        "Edit a file: view, create, str_replace (old_str must occur once), insert (after "
        "insert_line), undo. Returns a diff.",
        {
            "command": {
                "type": "string",
                "enum": ["view", "create", "str_replace", "insert", "undo"],
            },
            "path": {"type": "string"},
            "file_text": {"type": "string"},
            "old_str": {"type": "string"},
            "new_str": {"type": "string"},
            "insert_line": {"type": "integer"},
            "view_range": {"type": "array", "items": {"type": "integer"}},
        },
        ["command", "path"],
    ),
    _fn(
        "execute_python",
        "Run a Python snippet in an interpreter (state persists between calls), e.g. for a quick "
        "calculation. It makes no file: write a script with write_file and run it, or tests, "
        "with execute_bash (python f.py, python -m pytest).",
        {"code": {"type": "string"}},
        ["code"],
    ),
    _fn(
        "think",
        "Write down a thought or plan. Nothing runs.",
        {"thought": {"type": "string"}},
        ["thought"],
    ),
    _fn(
        "delegate",
        "Hand a large, self-contained sub-task to a helper agent; you get its result back. "
        "Do small tasks yourself.",
        {
            "task": {"type": "string", "description": "What the helper must do."},
            "max_iterations": {"type": "integer"},
        },
        ["task"],
    ),
    _fn(
        "finish",
        "End the task: a short message with the result for the user, and optional outputs.",
        {
            "message": {"type": "string"},
            "outputs": {"type": "object", "description": "Named results, if any."},
        },
        ["message"],
    ),
]

TOOL_NAMES: tuple[str, ...] = tuple(spec["function"]["name"] for spec in TOOL_SPECS)

# The operator's MCP tools, by function name (mcp__<server>__<tool>): offered at start-up.
_MCP_TOOLS: dict[str, McpTool] = {}


def offer_mcp_tools(tools: list[McpTool]) -> None:
    """Offer these MCP tools to the LLM next to the built-in ones: TOOL_SPECS (what every
    call sends) gains their schemas. Called once, at start-up, before any step."""
    for tool in tools:
        if tool.function not in _MCP_TOOLS:
            _MCP_TOOLS[tool.function] = tool
            TOOL_SPECS.append(tool.spec())


# Built-in tools taken out of the offer (withhold_tools): not described, and a call is refused.
_WITHHELD: dict[str, dict[str, Any]] = {}
# What the agent needs whatever else is withheld.
_ALWAYS_OFFERED = ("execute_bash", "finish")


def withhold_tools(names: Collection[str]) -> None:
    """Offer every built-in tool but these (DECKHANDS_AGENT_WITHHELD_TOOLS). A tool withheld
    before and not named now is offered again, in its place. Called at start-up.

    For small models: asked for "a Python script", a 1.5B model ran a snippet in execute_python
    and wrote no file; given a small task, it delegated it with a few iterations and reported
    the helper's failure. Without those tools it writes the file and runs it with execute_bash
    (where `python -c` still runs a snippet), and does the task itself."""
    unknown = set(names) - set(TOOL_NAMES)
    if unknown or set(names) & set(_ALWAYS_OFFERED):
        raise ValueError(
            f"cannot withhold {sorted(unknown | (set(names) & set(_ALWAYS_OFFERED)))}: the "
            f"built-in tools that can be withheld are "
            f"{[n for n in TOOL_NAMES if n not in _ALWAYS_OFFERED]}"
        )
    for name in [n for n in _WITHHELD if n not in names]:
        spec = _WITHHELD.pop(name)
        at = sum(
            1 for s in TOOL_SPECS if s["function"]["name"] in TOOL_NAMES[: TOOL_NAMES.index(name)]
        )
        TOOL_SPECS.insert(at, spec)
    for name in names:
        if name not in _WITHHELD:
            spec = next(s for s in TOOL_SPECS if s["function"]["name"] == name)
            TOOL_SPECS.remove(spec)
            _WITHHELD[name] = spec


def tool_offered(name: str) -> bool:
    return name not in _WITHHELD


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
    "think": _Think,
    "delegate": _Delegate,
    "finish": _Finish,
}


def _explain(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _decode_arguments(call: ToolCall) -> dict[str, Any]:
    raw = call.arguments
    if isinstance(raw, str):
        if not raw.strip():
            raw = "{}"
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise BadReply(f"the arguments of {call.name} are not valid JSON ({exc})") from exc
    if not isinstance(raw, dict):
        raise BadReply(f"the arguments of {call.name} must be a JSON object")
    return raw


def action_for_call(call: ToolCall, fields: dict[str, Any]) -> AgentToolAction:
    """The Action a tool call asks for; `fields` are the event fields (id, task_id, cause...)."""
    mcp_tool = _MCP_TOOLS.get(call.name)
    if mcp_tool is not None:
        # The server checks the arguments against its schema; a refusal is its observation.
        arguments = _decode_arguments(call)
        return MCPCallAction(
            server=mcp_tool.server, tool=mcp_tool.name, arguments=arguments, **fields
        )
    model = TOOL_ARGUMENTS.get(call.name) if call.name not in _WITHHELD else None
    if model is None:
        names = ", ".join(spec["function"]["name"] for spec in TOOL_SPECS)
        raise BadReply(f"there is no tool named {call.name!r}; the tools are: {names}")
    try:
        args: Any = model.model_validate(_decode_arguments(call))
        return _build(call.name, args, fields)
    except ValidationError as exc:
        raise BadReply(f"bad arguments for {call.name}: {_explain(exc)}") from exc


def _build(name: str, args: Any, fields: dict[str, Any]) -> AgentToolAction:
    if name == "execute_bash":
        return CmdRunAction(
            command=args.command, timeout_s=args.timeout, is_input=args.is_input, **fields
        )
    if name == "execute_python":
        # Small models often indent a whole snippet, which Python refuses.
        return RunPythonAction(code=textwrap.dedent(args.code), **fields)
    if name == "read_file":
        return FileReadAction(
            path=args.path, start_line=args.start_line, end_line=args.end_line, **fields
        )
    if name == "write_file":
        return FileWriteAction(path=args.path, content=args.content, **fields)
    if name == "edit_file":
        return FileEditAction(**args.model_dump(), **fields)
    if name == "think":
        text = fields.get("thought") or ""
        thought = f"{text}\n\n{args.thought}" if text and text != args.thought else args.thought
        return AgentThinkAction(**{**fields, "thought": thought})
    if name == "delegate":
        return AgentDelegateAction(task=args.task, max_iterations=args.max_iterations, **fields)
    return AgentFinishAction(final_message=args.message, outputs=args.outputs, **fields)


def call_for_action(action: object) -> tuple[str, dict[str, Any]] | None:
    """The tool name and arguments that produced an action, to replay it in the prompt."""
    if isinstance(action, CmdRunAction):
        args: dict[str, Any] = {"command": action.command}
        if action.timeout_s is not None:
            args["timeout"] = action.timeout_s
        if action.is_input:
            args["is_input"] = True
        return "execute_bash", args
    if isinstance(action, RunPythonAction):
        return "execute_python", {"code": action.code}
    if isinstance(action, FileReadAction):
        args = {"path": action.path}
        if action.start_line != 1:
            args["start_line"] = action.start_line
        if action.end_line is not None:
            args["end_line"] = action.end_line
        return "read_file", args
    if isinstance(action, FileWriteAction):
        content = action.content
        if action.content_ref is not None:  # the model wrote it; repeating it costs context
            content = f"[{action.content_ref.size:,} bytes, not repeated here]"
        return "write_file", {"path": action.path, "content": content}
    if isinstance(action, FileEditAction):
        edit = action.model_dump(
            include={
                "command",
                "path",
                "file_text",
                "old_str",
                "new_str",
                "insert_line",
                "view_range",
            },
            exclude_none=True,
        )
        return "edit_file", edit
    if isinstance(action, AgentThinkAction):
        return "think", {"thought": action.thought}
    if isinstance(action, AgentDelegateAction):
        args = {"task": action.task}
        if action.max_iterations is not None:
            args["max_iterations"] = action.max_iterations
        return "delegate", args
    if isinstance(action, MCPCallAction):
        return function_name(action.server, action.tool), dict(action.arguments)
    if isinstance(action, AgentFinishAction):
        args = {"message": action.final_message}
        if action.outputs:
            args["outputs"] = action.outputs
        return "finish", args
    return None


def _type_text(prop: dict[str, Any]) -> str:
    # The values an enum takes, not just "string": a model shown only the type guessed a bash
    # command for edit_file's `command`.
    if "enum" in prop:
        return "|".join(json.dumps(value) for value in prop["enum"])
    return str(prop.get("type", "any"))


def describe_tools() -> str:
    """The tools as prompt text, for models without native function calling."""
    lines = []
    for spec in TOOL_SPECS:
        fn = spec["function"]
        params = fn["parameters"]
        args = ", ".join(
            f'"{name}"{"" if name in params.get("required", []) else "?"}: {_type_text(prop)}'
            for name, prop in params["properties"].items()
        )
        lines.append(f"- {fn['name']} {{{args}}}: {fn['description']}")
    return "\n".join(lines)
