"""The tools offered to the LLM: their function-calling schemas (TOOL_SPECS, what every call
sends), the operator's MCP tools offered next to the built-in ones, the built-in ones withheld
from the offer, and the offer as prompt text for models without native function calling.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from shared.mcp_config import McpTool

__all__ = [
    "TOOL_NAMES",
    "TOOL_SPECS",
    "describe_tools",
    "offer_mcp_tools",
    "offered_mcp_tool",
    "tool_offered",
    "withhold_tools",
]


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
        "glob",
        "Find files by name: paths matching a glob such as **/*.py under path (default the "
        "working directory), newest first; what .gitignore names is left out.",
        {"pattern": {"type": "string"}, "path": {"type": "string"}},
        ["pattern"],
    ),
    _fn(
        "grep",
        "Search file contents: the lines matching a regular expression, with file and line "
        "number; include limits it to files matching a glob (e.g. *.py).",
        {
            "pattern": {"type": "string"},
            "path": {"type": "string"},
            "include": {"type": "string"},
        },
        ["pattern"],
    ),
    _fn(
        "apply_patch",
        "Apply a unified diff (as `git diff` prints it) to the files: every hunk or none; an "
        "error names the hunk that does not apply.",
        {"patch": {"type": "string"}},
        ["patch"],
    ),
    _fn(
        "task_tracker",
        "Keep your plan: command plan sets the whole list of tasks (title, status todo, "
        "in_progress or done, notes); view shows it. Nothing runs.",
        {
            "command": {"type": "string", "enum": ["plan", "view"]},
            "tasks": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "title": {"type": "string"},
                        "status": {"type": "string", "enum": ["todo", "in_progress", "done"]},
                        "notes": {"type": "string"},
                    },
                    "required": ["title"],
                },
            },
        },
        ["command"],
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


def offered_mcp_tool(name: str) -> McpTool | None:
    """The MCP tool offered under this function name (mcp__<server>__<tool>), if any."""
    return _MCP_TOOLS.get(name)


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
