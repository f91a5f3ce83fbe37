"""The agent's tools: the Action each call becomes, and the call an action came from.

A tool call is validated here; anything wrong with it (unknown tool, arguments that are not JSON,
a missing or mistyped argument) raises `BadReply`, which the reasoner turns into an
ErrorObservation the model sees on its next step. The tools' function-calling schemas, and
which are offered, are in tool_specs.py, their argument models in tool_arguments.py; both are
importable from here too.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from shared.events import (
    AgentDelegateAction,
    AgentFinishAction,
    AgentThinkAction,
    ApplyPatchAction,
    CmdRunAction,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    GlobAction,
    GrepAction,
    MCPCallAction,
    PlanItem,
    RunPythonAction,
    TaskTrackerAction,
)
from shared.mcp_config import function_name

from .errors import BadReply
from .tool_arguments import TOOL_ARGUMENTS
from .tool_specs import (
    TOOL_NAMES,
    TOOL_SPECS,
    describe_tools,
    offer_mcp_tools,
    offered_mcp_tool,
    tool_offered,
    withhold_tools,
)

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
    | GlobAction
    | GrepAction
    | ApplyPatchAction
    | TaskTrackerAction
)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str | dict[str, Any]  # as received: a JSON string (native) or an object (text)
    id: str | None = None


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
    mcp_tool = offered_mcp_tool(call.name)
    if mcp_tool is not None:
        # The server checks the arguments against its schema; a refusal is its observation.
        arguments = _decode_arguments(call)
        return MCPCallAction(
            server=mcp_tool.server, tool=mcp_tool.name, arguments=arguments, **fields
        )
    model = TOOL_ARGUMENTS.get(call.name) if tool_offered(call.name) else None
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
    if name == "glob":
        return GlobAction(pattern=args.pattern, path=args.path, **fields)
    if name == "grep":
        return GrepAction(pattern=args.pattern, path=args.path, include=args.include, **fields)
    if name == "apply_patch":
        return ApplyPatchAction(patch=args.patch, **fields)
    if name == "task_tracker":
        tasks = [PlanItem(**item.model_dump()) for item in args.tasks]
        return TaskTrackerAction(command=args.command, tasks=tasks, **fields)
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
    if isinstance(action, GlobAction):
        return "glob", action.model_dump(include={"pattern", "path"}, exclude_defaults=True)
    if isinstance(action, GrepAction):
        found = action.model_dump(include={"pattern", "path", "include"}, exclude_defaults=True)
        return "grep", found
    if isinstance(action, ApplyPatchAction):
        return "apply_patch", {"patch": action.patch}
    if isinstance(action, TaskTrackerAction):
        plan = [item.model_dump(exclude_defaults=True) for item in action.tasks]
        return "task_tracker", {"command": action.command, "tasks": plan}
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
