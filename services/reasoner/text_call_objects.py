"""Reading a tool call out of a JSON object a model wrote as text: {"tool": ..., "arguments":
...}, {"name": ..., "arguments": ...}, the arguments inline, or the arguments alone."""

from __future__ import annotations

import json
import re
from typing import Any

from .tool_specs import TOOL_SPECS
from .tools import ToolCall

__all__ = ["json_objects", "looks_like_call", "python_strings_as_json", "tool_call_from_object"]

# Small models put code in a Python triple-quoted string inside the JSON.
_TRIPLE_QUOTED = re.compile(r'"""(.*?)"""', re.DOTALL)


def tool_call_from_object(obj: Any) -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    args = obj.get("arguments", obj.get("parameters", obj.get("args")))
    # {"name": ...} alone is too common in ordinary JSON to be read as a call.
    name = obj.get("tool", obj.get("name") if args is not None else None)
    if name is None and args is None:
        # {"message": "...", "outputs": {...}}: a small model wrote only the arguments. Read
        # them as the call of the one tool whose arguments they are, if exactly one fits.
        name = _tool_for_arguments(obj)
        if name is not None:
            return ToolCall(name=name, arguments=obj)
    if not isinstance(name, str):
        return None
    if args is None:
        # {"tool": "execute_bash", "command": "ls"}: the arguments written inline.
        args = {k: v for k, v in obj.items() if k not in ("tool", "name")}
    if not isinstance(args, str | dict):
        args = json.dumps(args)
    return ToolCall(name=name, arguments=args)


def _tool_for_arguments(obj: dict[str, Any]) -> str | None:
    keys = set(obj)
    fits = [
        spec["function"]["name"]
        for spec in TOOL_SPECS
        if set(spec["function"]["parameters"].get("required", [])) <= keys
        and keys <= set(spec["function"]["parameters"]["properties"])
    ]
    return fits[0] if len(fits) == 1 else None


def json_objects(text: str) -> list[tuple[Any, int, int]]:
    """Every top-level JSON object in the text, with its span."""
    found = []
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        found.append((obj, i, end))
        i = text.find("{", end)
    return found


def python_strings_as_json(text: str) -> str:
    return _TRIPLE_QUOTED.sub(lambda m: json.dumps(m.group(1)), text)


def looks_like_call(text: str) -> bool:
    return bool(re.search(r'"tool"\s*:|"name"\s*:.*"arguments"\s*:', text, re.DOTALL))
