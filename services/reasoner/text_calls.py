"""Tool calls written in a reply's text, as models without function calling (and small local
models even with it) write them: JSON objects, bare or in ```json blocks, and in prompt-based
mode ```bash or ```python blocks. Several calls in one reply are read in order."""

from __future__ import annotations

import re

from .errors import BadReply
from .text_call_objects import (
    json_objects,
    looks_like_call,
    python_strings_as_json,
    tool_call_from_object,
)
from .tools import ToolCall, tool_offered

__all__ = ["parse_text_tool_call", "parse_text_tool_calls"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
# Tags that Qwen-style models wrap a call in (<tool_call>, <tools>): not part of a thought.
_WRAPPER_TAGS = re.compile(r"</?(?:tool_call|tools|function_call)>")
_SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
_PYTHON_LANGS = {"python", "py", "python3"}


def parse_text_tool_call(text: str, *, code_blocks: bool) -> tuple[ToolCall, str] | None:
    """The first tool call written in the text, and the text before it; None if there is none.

    Raises BadReply when the text clearly tries to call a tool but the JSON is broken.
    """
    found = parse_text_tool_calls(text, code_blocks=code_blocks)
    return (found[0][0], found[1]) if found is not None else None


def parse_text_tool_calls(text: str, *, code_blocks: bool) -> tuple[list[ToolCall], str] | None:
    """Every tool call written in the text, in order (a small model often writes out several
    steps at once), and the text before the first; None if there is none. After the first
    call, a block that is not a valid call ends the list.

    Raises BadReply when the text clearly tries to call a tool but the first call's JSON is
    broken.
    """
    calls: list[ToolCall] = []
    thought = ""
    for match in _FENCE.finditer(text):
        try:
            call = _fenced_call(match.group(1).lower(), match.group(2), code_blocks=code_blocks)
        except BadReply:
            if calls:
                break
            raise
        if call is None:
            if calls:
                break
            continue
        if not calls:
            # The thought is what came before the call: what follows (more calls, the output
            # it expects) is the model running ahead, and would mislead it on its next turn.
            thought = text[: match.start()].strip()
        calls.append(call)
    if calls:
        return calls, thought
    for obj, start, _end in json_objects(text):
        call = tool_call_from_object(obj)
        if call is None:
            if calls:
                break
            continue
        if not calls:
            thought = _WRAPPER_TAGS.sub("", text[:start]).strip()
        calls.append(call)
    if calls:
        return calls, thought
    stripped = text.strip()
    if stripped.startswith("{") and looks_like_call(stripped):
        raise BadReply("the tool call is not valid JSON")
    return None


def _fenced_call(lang: str, body: str, *, code_blocks: bool) -> ToolCall | None:
    """The call a fenced block holds, if it is one."""
    if lang in ("json", "") and body.strip().startswith("{"):
        objects = json_objects(body) or json_objects(python_strings_as_json(body))
        call = tool_call_from_object(objects[0][0]) if objects else None
        if call is not None:
            return call
        if looks_like_call(body):
            raise BadReply("the tool call in the ```json block is not valid JSON")
    elif code_blocks and lang in _SHELL_LANGS and body.strip():
        return ToolCall("execute_bash", {"command": body.strip()})
    elif code_blocks and lang in _PYTHON_LANGS and body.strip():
        if not tool_offered("execute_python"):
            raise BadReply(
                "a ```python block runs nothing here: write the script with write_file, "
                "then run it with execute_bash"
            )
        return ToolCall("execute_python", {"code": body})
    return None
