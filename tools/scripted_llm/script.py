"""The script a scripted server answers from: its format, read and checked.

Script file (JSON)
------------------
Either a list of turns, or an object::

    {
      "model": "scripted",            # the id /v1/models lists (optional)
      "turns": [TURN, ...],           # the default conversation
      "conversations": [              # optional: per-task scripts, the first whose "match" is a
        {"match": "squares",          #   case-insensitive substring of the task (the first user
         "turns": [TURN, ...],        #   message) is used; otherwise "turns"
         "context_window": 4000}      # optional: a longer prompt (characters / 4) is refused
      ],                              #   with a 400 "maximum context length" error
      "exhausted": TURN,              # optional: the reply once the turns are used up
                                      #   (default: the last turn again)
      "limits": {...}                 # optional: a provider's limits (limits.py)
    }

A TURN is one model reply:

    {"tool": "write_file", "arguments": {"path": "a.py", "content": "..."}}   a tool call
    {"tool": "execute_bash", "arguments": {...}, "content": "I will run it"} with some text
    {"content": "Which file do you mean?"}                                   a plain text reply
    {"tool": "execute_bash", "raw_arguments": "{\"command\": "}              arguments sent
                                                                             verbatim (malformed)

Malformed calls for tests: `raw_arguments` that are not JSON, a `tool` the agent does not know,
or `arguments` missing a required field. Options on any turn:

    "as_text": true        write the tool call as JSON in the text content instead of a native
                           tool call, as small local models do;
    "fail_first": {"status": 503, "times": 2, "retry_after": 1.5}
                           the first N requests for this turn of this conversation get that HTTP
                           error (the only per-process state: for retry tests), with a
                           Retry-After header (seconds) when `retry_after` is given;
    "delay_s": 0.5         wait before answering (for timeout tests).

When the request offers no `tools` (prompt-based tool calling), a tool turn is always written as
text: a fenced ```json block holding {"tool": ..., "arguments": ...}.

Values a turn's text and arguments may name: {{task}}, {{turn}} (1-based), {{last_tool_output}},
{{last_user_message}} (the latest user message: the task or one sent since) and {{nth}} (how
often the server answered this turn of this conversation: forks of a task each reach the same
turn, and a script may tell them apart).

Which turn answers a request is tools/scripted_llm/responder.py's; a script's `limits` are
described in tools/scripted_llm/limits.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "LIMIT_COUNTS",
    "Conversation",
    "Limits",
    "Script",
    "ScriptError",
    "Turn",
    "load_script",
    "parse_script",
]


class ScriptError(ValueError):
    """The script file is not valid; the message says where."""


@dataclass(frozen=True)
class Turn:
    content: str | None = None
    tool: str | None = None
    arguments: Any = None
    raw_arguments: str | None = None
    as_text: bool = False
    fail_status: int = 0
    fail_times: int = 0
    fail_retry_after_s: float | None = None
    delay_s: float = 0.0


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]
    match: str | None = None
    context_window: int | None = None  # in tokens (characters / 4) of the whole request


@dataclass(frozen=True)
class Limits:
    """A provider's limits; None is no limit."""

    max_concurrent: int | None = None
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    retry_after_s: float = 1.0  # the Retry-After of a 429 for too many concurrent requests


@dataclass(frozen=True)
class Script:
    conversations: tuple[Conversation, ...]
    model: str = "scripted"
    exhausted: Turn | None = None
    limits: Limits = field(default_factory=Limits)

    def conversation_for(self, task: str) -> Conversation | None:
        lowered = task.lower()
        for conv in self.conversations:
            if conv.match is not None and conv.match.lower() in lowered:
                return conv
        return next((c for c in self.conversations if c.match is None), None)


_TURN_KEYS = {"content", "tool", "arguments", "raw_arguments", "as_text", "fail_first", "delay_s"}


def _parse_turn(raw: Any, where: str) -> Turn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a turn must be an object, got {type(raw).__name__}")
    unknown = set(raw) - _TURN_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_TURN_KEYS)}")
    tool = raw.get("tool")
    content = raw.get("content")
    if tool is None and content is None:
        raise ScriptError(f"{where}: a turn needs 'tool' or 'content'")
    if tool is not None and not isinstance(tool, str):
        raise ScriptError(f"{where}: 'tool' must be a string")
    if content is not None and not isinstance(content, str):
        raise ScriptError(f"{where}: 'content' must be a string")
    if "arguments" in raw and "raw_arguments" in raw:
        raise ScriptError(f"{where}: give 'arguments' or 'raw_arguments', not both")
    if tool is None and ("arguments" in raw or "raw_arguments" in raw):
        raise ScriptError(f"{where}: arguments without a 'tool'")
    raw_arguments = raw.get("raw_arguments")
    if raw_arguments is not None and not isinstance(raw_arguments, str):
        raise ScriptError(f"{where}: 'raw_arguments' must be a string")
    fail = raw.get("fail_first") or {}
    if not isinstance(fail, dict) or set(fail) - {"status", "times", "retry_after"}:
        raise ScriptError(
            f"{where}: 'fail_first' must be {{'status': int, 'times': int, 'retry_after': s}}"
        )
    try:
        fail_status = int(fail.get("status", 503)) if fail else 0
        fail_times = int(fail.get("times", 1)) if fail else 0
        retry_after = fail.get("retry_after")
        fail_retry_after_s = None if retry_after is None else float(retry_after)
        delay_s = float(raw.get("delay_s", 0.0))
    except (TypeError, ValueError) as exc:
        raise ScriptError(f"{where}: {exc}") from exc
    if fail_retry_after_s is not None and fail_retry_after_s < 0:
        raise ScriptError(f"{where}: 'fail_first.retry_after' must be >= 0")
    if fail and not 400 <= fail_status <= 599:
        raise ScriptError(f"{where}: 'fail_first.status' must be an HTTP error status")
    return Turn(
        content=content,
        tool=tool,
        arguments=raw.get("arguments", {}) if tool is not None else None,
        raw_arguments=raw_arguments,
        as_text=bool(raw.get("as_text", False)),
        fail_status=fail_status,
        fail_times=fail_times,
        fail_retry_after_s=fail_retry_after_s,
        delay_s=delay_s,
    )


def _parse_turns(raw: Any, where: str) -> tuple[Turn, ...]:
    if not isinstance(raw, list) or not raw:
        raise ScriptError(f"{where}: 'turns' must be a non-empty list")
    return tuple(_parse_turn(t, f"{where}[{i}]") for i, t in enumerate(raw))


LIMIT_COUNTS = ("max_concurrent", "requests_per_minute", "tokens_per_minute")


def _parse_limits(raw: Any) -> Limits:
    if not isinstance(raw, dict):
        raise ScriptError("'limits' must be an object")
    unknown = set(raw) - {*LIMIT_COUNTS, "retry_after_s"}
    if unknown:
        raise ScriptError(f"limits: unknown keys {sorted(unknown)}")
    counts: dict[str, int | None] = {}
    for key in LIMIT_COUNTS:
        value = raw.get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ScriptError(f"limits: '{key}' must be a positive int")
        counts[key] = value
    retry_after = raw.get("retry_after_s", 1.0)
    if isinstance(retry_after, bool) or not isinstance(retry_after, int | float) or retry_after < 0:
        raise ScriptError("limits: 'retry_after_s' must be a number >= 0")
    return Limits(**counts, retry_after_s=float(retry_after))


def parse_script(raw: Any) -> Script:
    if isinstance(raw, list):
        raw = {"turns": raw}
    if not isinstance(raw, dict):
        raise ScriptError("a script is a list of turns or an object with 'turns'")
    unknown = set(raw) - {"model", "turns", "conversations", "exhausted", "limits"}
    if unknown:
        raise ScriptError(f"unknown top-level keys {sorted(unknown)}")
    conversations: list[Conversation] = []
    for i, conv in enumerate(raw.get("conversations", [])):
        if not isinstance(conv, dict) or not isinstance(conv.get("match"), str):
            raise ScriptError(f"conversations[{i}]: needs a string 'match' and 'turns'")
        unknown = set(conv) - {"match", "turns", "context_window"}
        if unknown:
            raise ScriptError(f"conversations[{i}]: unknown keys {sorted(unknown)}")
        turns = _parse_turns(conv.get("turns"), f"conversations[{i}].turns")
        window = conv.get("context_window")
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ScriptError(f"conversations[{i}]: 'context_window' must be a positive int")
        conversations.append(Conversation(turns, conv["match"], window))
    if "turns" in raw:
        conversations.append(Conversation(_parse_turns(raw["turns"], "turns")))
    if not conversations:
        raise ScriptError("the script has no 'turns' and no 'conversations'")
    exhausted = _parse_turn(raw["exhausted"], "exhausted") if "exhausted" in raw else None
    limits = _parse_limits(raw["limits"]) if "limits" in raw else Limits()
    return Script(tuple(conversations), str(raw.get("model", "scripted")), exhausted, limits)


def load_script(path: str | Path) -> Script:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ScriptError(f"cannot read script {path}: {exc}") from exc
    try:
        return parse_script(raw)
    except ScriptError as exc:
        raise ScriptError(f"{path}: {exc}") from exc
