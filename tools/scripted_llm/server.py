"""A scripted OpenAI-compatible chat server: litellm reaches it exactly as it reaches a provider.

    python -m tools.scripted_llm --script tools/scripted_llm/scripts/seed_squares.json --port 8765

then point deckhands at it with DECKHANDS_LLM_MODEL=openai/scripted,
DECKHANDS_LLM_API_BASE=http://127.0.0.1:8765/v1 and any DECKHANDS_LLM_API_KEY.

Endpoints: `POST /v1/chat/completions` (JSON, or Server-Sent Events when `stream` is true),
`GET /v1/models`, `GET /health`, and `GET /stats`: the chat requests received so far (failed
ones included, those refused by the limits below not), in total and per task (the first user
message), and what the limits saw, e.g. {"requests": 3, "tasks": {"Write squares": 3},
"refused_429": 0, "max_concurrent_seen": 1, "max_requests_in_60s": 3, "max_tokens_in_60s": 950}.
Any model name and any API key are accepted.
`GET /prompts?task=TEXT`: what the model was sent, for tests that check a prompt (what a
provider would see): {"prompts": [{"task": ..., "requests": [{"messages": [...]}, ...]}]}, one
entry per task whose first user message contains TEXT (case-sensitive), with its last
PROMPTS_PER_TASK requests, oldest first; the last PROMPT_TASKS tasks are kept.

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
      "limits": {...}                 # optional: a provider's limits, below
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

Which turn answers a request
----------------------------
The server is stateless: the turn is the number of replies the model already gave in the
request's conversation, i.e. the number of `assistant` messages plus the number of `user`
messages starting with "Your previous reply was invalid" (how the reasoner reports a reply it
could not use, which leaves no assistant message), plus N for a user message starting with
"[Condensed history] N earlier" (how the reasoner stands in for N replies it condensed away).
Any replica, or a restarted server, answers the same conversation the same way.

Templates, in `content` and in any string inside `arguments`:

    {{last_tool_output}}   content of the last `tool` message (or, without tool messages, of the
                           last user message after the task), as a real model would quote it
    {{task}}               the first user message
    {{turn}}               the turn number, from 1
    {{repeat:N:TEXT}}      TEXT written N times (a large argument without a large script)

`usage` reports tokens as characters / 4, like a real provider's rough count.

Limits
------
A provider's limits, for tests and benchmarks that check deckhands never exceeds them and
waits out a 429 (each key optional; none by default)::

    "limits": {
      "max_concurrent": 20,           # chat requests being answered at once
      "requests_per_minute": 600,     # requests admitted in the last 60 s (a sliding window)
      "tokens_per_minute": 100000,    # their prompt + completion tokens in the last 60 s
      "retry_after_s": 1.0            # the Retry-After of a 429 for max_concurrent
    }

or on the command line, which wins over the script: `--max-concurrent N`,
`--requests-per-minute N`, `--tokens-per-minute N`. A chat request beyond a limit is answered
at once with a 429 {"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", ...}}
and a Retry-After header in seconds: `retry_after_s` (as in "1" or "0.5") for max_concurrent;
for the per-minute limits the whole seconds, 1 to 60, until the window has room for it again.
A request counts as being answered from its arrival until its reply is ready (`delay_s` and
`fail_first` included); its prompt tokens enter the window when it arrives (a request is
refused when they would take the window over the limit; one larger than the limit itself
always is, with Retry-After 60), its completion tokens when it is answered. A refused request
counts toward no window, nor in /stats `requests` and `tasks` (nor /prompts): /stats
`refused_429` counts them, and `max_concurrent_seen`, `max_requests_in_60s` (measured at each
admitted request's arrival) and `max_tokens_in_60s` are the most the admitted ones reached,
limits or not. A body whose `messages` cannot be read is answered 400 before the limits.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import re
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "CONDENSED_MARKER",
    "INVALID_REPLY_MARKER",
    "LIMIT_WINDOW_S",
    "PROMPTS_PER_TASK",
    "PROMPT_TASKS",
    "Limits",
    "Script",
    "ScriptError",
    "ScriptedLLMServer",
    "Turn",
    "load_script",
    "main",
]

log = logging.getLogger("deckhands.scripted_llm")

INVALID_REPLY_MARKER = "Your previous reply was invalid"
# The reasoner's note in place of condensed history: "[Condensed history] 12 earlier ...".
CONDENSED_MARKER = "[Condensed history]"
_CONDENSED = re.compile(r"^\[Condensed history\] (\d+) earlier")
_TEMPLATE_KEYS = ("last_tool_output", "task", "turn")
# What /prompts keeps: bounded, for load tests with hundreds of agents run on this server too.
PROMPTS_PER_TASK = 4
PROMPT_TASKS = 64
_REPEAT = re.compile(r"\{\{repeat:(\d{1,9}):(.*?)\}\}", re.DOTALL)
# The sliding window of the per-minute limits, and of the /stats maxima over it.
LIMIT_WINDOW_S = 60.0


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


_LIMIT_COUNTS = ("max_concurrent", "requests_per_minute", "tokens_per_minute")


def _parse_limits(raw: Any) -> Limits:
    if not isinstance(raw, dict):
        raise ScriptError("'limits' must be an object")
    unknown = set(raw) - {*_LIMIT_COUNTS, "retry_after_s"}
    if unknown:
        raise ScriptError(f"limits: unknown keys {sorted(unknown)}")
    counts: dict[str, int | None] = {}
    for key in _LIMIT_COUNTS:
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


# --- reading a request's conversation -------------------------------------------------------


def _text(content: Any) -> str:
    """A message's content as text, whether a string or a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    return str(content)


@dataclass
class _Conversation:
    messages: list[dict[str, Any]]
    task: str = ""
    replies_so_far: int = 0
    last_tool_output: str = ""
    prompt_chars: int = 0
    offers_tools: bool = False
    key: str = field(default="")


def _read_conversation(body: dict[str, Any]) -> _Conversation:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _HttpError(400, "'messages' must be a non-empty list")
    conv = _Conversation(messages=messages, offers_tools=bool(body.get("tools")))
    first_user_seen = False
    last_tool: str | None = None
    last_user_after_task: str | None = None
    for msg in messages:
        if not isinstance(msg, dict):
            raise _HttpError(400, "every message must be an object")
        role, text = msg.get("role"), _text(msg.get("content"))
        conv.prompt_chars += len(text) + len(json.dumps(msg.get("tool_calls") or ""))
        if role == "assistant":
            conv.replies_so_far += 1
        elif role == "tool":
            last_tool = text
        elif role == "user":
            if not first_user_seen:
                conv.task, first_user_seen = text, True
            else:
                last_user_after_task = text
                if text.startswith(INVALID_REPLY_MARKER):
                    conv.replies_so_far += 1
                condensed = _CONDENSED.match(text)
                if condensed:
                    conv.replies_so_far += int(condensed.group(1))
    conv.prompt_chars += len(json.dumps(body.get("tools") or ""))
    conv.last_tool_output = last_tool if last_tool is not None else last_user_after_task or ""
    conv.last_tool_output = conv.last_tool_output.rstrip()
    conv.key = hashlib.sha1(conv.task.encode()).hexdigest()[:16]
    return conv


def _render(value: Any, values: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key in _TEMPLATE_KEYS:
            value = value.replace("{{" + key + "}}", values[key])
        return _REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), value)
    if isinstance(value, list):
        return [_render(v, values) for v in value]
    if isinstance(value, dict):
        return {k: _render(v, values) for k, v in value.items()}
    return value


def _tokens(chars: int) -> int:
    return max(1, (chars + 3) // 4)


# --- answering --------------------------------------------------------------------------------


class _HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.code, self.retry_after_s = code, retry_after_s


@dataclass(frozen=True)
class _Reply:
    content: str | None
    tool_name: str | None
    tool_arguments: str | None
    tool_call_id: str | None
    prompt_tokens: int
    completion_tokens: int

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_name else "stop"

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_name:
            msg["tool_calls"] = [self._tool_call()]
        return msg

    def _tool_call(self) -> dict[str, Any]:
        return {
            "id": self.tool_call_id,
            "type": "function",
            "function": {"name": self.tool_name, "arguments": self.tool_arguments},
        }

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def stream_deltas(self) -> Iterator[dict[str, Any]]:
        yield {"role": "assistant", "content": ""}
        if self.content:
            yield {"content": self.content}
        if self.tool_name:
            yield {"tool_calls": [{"index": 0, **self._tool_call()}]}


def _rate_limited(message: str, retry_after_s: float) -> _HttpError:
    return _HttpError(
        429, message, "rate_limit_error", code="rate_limit_exceeded", retry_after_s=retry_after_s
    )


class _Limiter:
    """A provider's limits on chat requests, and the most of each the server saw; thread-safe.

    A request counts as concurrent from its admission until its answer is ready; its prompt
    tokens enter the 60 s window when it is admitted, its completion tokens when it is answered.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._in_flight = 0
        self._arrivals: deque[float] = deque()  # the admitted requests of the last 60 s
        self._tokens: deque[tuple[float, int]] = deque()  # (when, tokens) of the last 60 s
        self._window_tokens = 0
        self._refused = 0
        self._max_concurrent = 0
        self._max_requests = 0
        self._max_tokens = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "refused_429": self._refused,
                "max_concurrent_seen": self._max_concurrent,
                "max_requests_in_60s": self._max_requests,
                "max_tokens_in_60s": self._max_tokens,
            }

    def admit(self, prompt_tokens: int) -> None:
        """Let a request in, or raise the 429 a provider would answer it with."""
        with self._lock:
            now = time.monotonic()
            self._prune(now)
            refusal = self._refusal(now, prompt_tokens)
            if refusal is not None:
                self._refused += 1
                raise refusal
            self._in_flight += 1
            self._max_concurrent = max(self._max_concurrent, self._in_flight)
            self._arrivals.append(now)
            self._max_requests = max(self._max_requests, len(self._arrivals))
            self._add_tokens(now, prompt_tokens)

    def done(self, completion_tokens: int) -> None:
        """An admitted request was answered (completion_tokens 0: with an error)."""
        with self._lock:
            self._in_flight -= 1
            if completion_tokens:
                now = time.monotonic()
                self._prune(now)
                self._add_tokens(now, completion_tokens)

    def _prune(self, now: float) -> None:
        start = now - LIMIT_WINDOW_S
        while self._arrivals and self._arrivals[0] <= start:
            self._arrivals.popleft()
        while self._tokens and self._tokens[0][0] <= start:
            self._window_tokens -= self._tokens.popleft()[1]

    def _add_tokens(self, now: float, tokens: int) -> None:
        self._tokens.append((now, tokens))
        self._window_tokens += tokens
        self._max_tokens = max(self._max_tokens, self._window_tokens)

    @staticmethod
    def _until_gone(now: float, when: float) -> float:
        """Whole seconds (at least 1) until what happened at `when` leaves the window."""
        return float(max(1, math.ceil(when + LIMIT_WINDOW_S - now)))

    def _refusal(self, now: float, prompt_tokens: int) -> _HttpError | None:
        limits = self.limits
        if limits.max_concurrent is not None and self._in_flight >= limits.max_concurrent:
            return _rate_limited(
                f"Rate limit reached for concurrent requests: Limit {limits.max_concurrent}, "
                f"Used {self._in_flight}, Requested 1.",
                limits.retry_after_s,
            )
        rpm, used = limits.requests_per_minute, len(self._arrivals)
        if rpm is not None and used >= rpm:
            # Room again once all but rpm - 1 of the window's requests have left it.
            wait = self._until_gone(now, self._arrivals[used - rpm])
            return _rate_limited(
                f"Rate limit reached for requests per min (RPM): Limit {rpm}, Used {used}, "
                f"Requested 1. Please try again in {wait:g}s.",
                wait,
            )
        tpm = limits.tokens_per_minute
        if tpm is not None and self._window_tokens + prompt_tokens > tpm:
            if prompt_tokens > tpm:  # never fits: OpenAI answers it with a 429 too
                return _rate_limited(
                    f"Request too large for tokens per min (TPM): Limit {tpm}, "
                    f"Requested {prompt_tokens}.",
                    LIMIT_WINDOW_S,
                )
            # Room again once enough of the oldest tokens have left the window.
            excess, frees = self._window_tokens + prompt_tokens - tpm, now
            for when, tokens in self._tokens:
                excess -= tokens
                if excess <= 0:
                    frees = when
                    break
            wait = self._until_gone(now, frees)
            return _rate_limited(
                f"Rate limit reached for tokens per min (TPM): Limit {tpm}, Used "
                f"{self._window_tokens}, Requested {prompt_tokens}. Please try again in "
                f"{wait:g}s.",
                wait,
            )
        return None


class _Responder:
    """Turns a chat request into the scripted reply; thread-safe."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.limiter = _Limiter(script.limits)
        self._failures: dict[tuple[str, int], int] = {}
        self._requests: dict[str, int] = {}
        self._prompts: OrderedDict[str, deque[Any]] = OrderedDict()
        self._lock = threading.Lock()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            tasks = dict(self._requests)
        return {"requests": sum(tasks.values()), "tasks": tasks, **self.limiter.stats()}

    def prompts(self, containing: str) -> dict[str, Any]:
        with self._lock:
            found = [
                {"task": task, "requests": [{"messages": m} for m in kept]}
                for task, kept in self._prompts.items()
                if containing in task
            ]
        return {"prompts": found}

    def _count(self, body: dict[str, Any]) -> None:
        task = ""
        messages = body.get("messages") or []
        for msg in messages:
            if isinstance(msg, dict) and msg.get("role") == "user":
                task = _text(msg.get("content"))
                break
        with self._lock:
            self._requests[task] = self._requests.get(task, 0) + 1
            kept = self._prompts.pop(task, None) or deque(maxlen=PROMPTS_PER_TASK)
            kept.append(messages)
            self._prompts[task] = kept
            while len(self._prompts) > PROMPT_TASKS:
                self._prompts.popitem(last=False)

    def reply(self, body: dict[str, Any]) -> _Reply:
        try:
            conv = _read_conversation(body)
        except _HttpError:
            self._count(body)
            raise
        prompt_tokens = _tokens(conv.prompt_chars)
        # Refused by the limits: not counted as a request of its task, nor kept in /prompts.
        self.limiter.admit(prompt_tokens)
        completion_tokens = 0
        try:
            self._count(body)
            reply = self._answer(conv, prompt_tokens)
            completion_tokens = reply.completion_tokens
            return reply
        finally:
            self.limiter.done(completion_tokens)

    def _answer(self, conv: _Conversation, prompt_tokens: int) -> _Reply:
        script_conv = self.script.conversation_for(conv.task)
        if script_conv is None:
            raise _HttpError(400, f"no conversation of the script matches the task {conv.task!r}")
        window = script_conv.context_window
        if window is not None and prompt_tokens > window:
            # Worded as OpenAI words it: litellm maps it to ContextWindowExceededError.
            raise _HttpError(
                400,
                f"This model's maximum context length is {window} tokens. However, your "
                f"messages resulted in {prompt_tokens} tokens. Please reduce the length of the "
                "messages.",
                code="context_length_exceeded",
            )
        index = conv.replies_so_far
        if index < len(script_conv.turns):
            turn = script_conv.turns[index]
        else:
            turn = self.script.exhausted or script_conv.turns[-1]
        self._maybe_fail(turn, conv.key, index)
        if turn.delay_s:
            time.sleep(turn.delay_s)

        values = {
            "last_tool_output": conv.last_tool_output,
            "task": conv.task,
            "turn": str(index + 1),
        }
        content = _render(turn.content, values) if turn.content is not None else None
        tool_name = tool_arguments = tool_call_id = None
        if turn.tool is not None:
            if turn.raw_arguments is not None:
                tool_arguments = turn.raw_arguments
            else:
                tool_arguments = json.dumps(_render(turn.arguments, values))
            if turn.as_text or not conv.offers_tools:
                # Prompt-based tool calling: the call is text the agent has to parse.
                call = f'{{"tool": {json.dumps(turn.tool)}, "arguments": {tool_arguments}}}'
                block = f"```json\n{call}\n```"
                content = f"{content}\n\n{block}" if content else block
            else:
                tool_name = turn.tool
                digest = hashlib.sha1(f"{conv.key}:{index}".encode()).hexdigest()[:24]
                tool_call_id = f"call_{digest}"
        completion_chars = len(content or "") + len(tool_name or "") + len(tool_arguments or "")
        if tool_name is None and not content:
            content = ""
        return _Reply(
            content=content,
            tool_name=tool_name,
            tool_arguments=tool_arguments if tool_name else None,
            tool_call_id=tool_call_id,
            prompt_tokens=prompt_tokens,
            completion_tokens=_tokens(completion_chars),
        )

    def _maybe_fail(self, turn: Turn, key: str, index: int) -> None:
        if not turn.fail_times:
            return
        with self._lock:
            seen = self._failures.get((key, index), 0)
            self._failures[(key, index)] = seen + 1
        if seen < turn.fail_times:
            raise _HttpError(
                turn.fail_status,
                f"scripted failure {seen + 1} of {turn.fail_times}",
                kind="server_error" if turn.fail_status >= 500 else "rate_limit_error",
                retry_after_s=turn.fail_retry_after_s,
            )


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The headers and the body go out in two writes: with Nagle's algorithm the body waited
    # for the client's delayed ACK of the headers, 40 ms on every call of a kept-alive
    # connection after its first few (a 6 ms "instant" reply measured 45 ms).
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    # --- routes ---

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path in ("/v1/models", "/models"):
            model = self.server.responder.script.model
            self._json(
                200,
                {
                    "object": "list",
                    "data": [
                        {"id": model, "object": "model", "created": 0, "owned_by": "deckhands"}
                    ],
                },
            )
        elif path in ("/health", "/healthz"):
            self._json(200, {"status": "ok"})
        elif path in ("/stats", "/v1/stats"):
            self._json(200, self.server.responder.stats())
        elif path in ("/prompts", "/v1/prompts"):
            query = parse_qs(self.path.partition("?")[2])
            self._json(200, self.server.responder.prompts(query.get("task", [""])[0]))
        else:
            self._error(_HttpError(404, f"no route {self.path}", "not_found_error"))

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._error(_HttpError(404, f"no route {self.path}", "not_found_error"))
            return
        try:
            body = self._read_json()
            reply = self.server.responder.reply(body)
        except _HttpError as exc:
            self._error(exc)
            return
        model = str(body.get("model") or self.server.responder.script.model)
        completion_id = f"chatcmpl-{hashlib.sha1(repr(reply).encode()).hexdigest()[:24]}"
        created = int(time.time())
        if body.get("stream"):
            options = body.get("stream_options") or {}
            self._stream(reply, model, completion_id, created, bool(options.get("include_usage")))
            return
        self._json(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "message": reply.message(), "finish_reason": reply.finish_reason}
                ],
                "usage": reply.usage(),
            },
        )

    # --- helpers ---

    def _read_json(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"null")
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _HttpError(400, f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _HttpError(400, "body must be a JSON object")
        return body

    def _json(
        self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
    ) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _error(self, exc: _HttpError) -> None:
        headers = {}
        if exc.retry_after_s is not None:
            headers["Retry-After"] = f"{exc.retry_after_s:g}"
        self._json(
            exc.status,
            {"error": {"message": exc.message, "type": exc.kind, "code": exc.code}},
            headers,
        )

    def _stream(
        self, reply: _Reply, model: str, completion_id: str, created: int, include_usage: bool
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

        def send(chunk: dict[str, Any]) -> None:
            self.wfile.write(f"data: {json.dumps({**base, **chunk})}\n\n".encode())

        for delta in reply.stream_deltas():
            send({"choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
        send({"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]})
        if include_usage:
            send({"choices": [], "usage": reply.usage()})
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Hundreds of agents call at once in load tests: the default backlog of 5 drops them.
    request_queue_size = 1024

    def __init__(self, address: tuple[str, int], responder: _Responder) -> None:
        super().__init__(address, _Handler)
        self.responder = responder


class ScriptedLLMServer:
    """The server in a background thread: `with ScriptedLLMServer(script) as srv: srv.base_url`."""

    def __init__(self, script: Script, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self._server = _Server((host, port), _Responder(script))
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self) -> ScriptedLLMServer:
        # A short poll interval: stop() returns at once, which keeps test teardown quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-llm",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> ScriptedLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tools.scripted_llm",
        description="A scripted OpenAI-compatible chat server (see the module docstring).",
    )
    parser.add_argument("--script", required=True, help="the script file (JSON)")
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1")
    for key in _LIMIT_COUNTS:
        flag = "--" + key.replace("_", "-")
        parser.add_argument(
            flag, type=_positive_int, metavar="N", help=f"limits.{key} (wins over the script)"
        )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s scripted-llm %(message)s")
    try:
        script = load_script(args.script)
    except ScriptError as exc:
        sys.exit(f"scripted_llm: {exc}")
    given = {key: getattr(args, key) for key in _LIMIT_COUNTS if getattr(args, key) is not None}
    if given:
        script = replace(script, limits=replace(script.limits, **given))
    try:
        server = ScriptedLLMServer(script, args.host, args.port)
    except OSError as exc:
        sys.exit(f"scripted_llm: cannot listen on {args.host}:{args.port}: {exc}")
    limits = ", ".join(
        f"{key} {getattr(script.limits, key)}"
        for key in _LIMIT_COUNTS
        if getattr(script.limits, key) is not None
    )
    print(
        f"scripted LLM listening on {server.base_url} (model {script.model}"
        + (f"; limits: {limits}" if limits else "")
        + ")",
        flush=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server._server.server_close()


if __name__ == "__main__":
    main()
