"""How the scripted server answers a chat request: the turn of the script it reads from the
request's conversation, and the reply it makes of that turn; and what it keeps of the requests
(/stats, /prompts).

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
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from .limits import Limiter
from .replies import HttpError, Reply
from .script import Script, Turn

__all__ = [
    "CONDENSED_MARKER",
    "INVALID_REPLY_MARKER",
    "PROMPTS_PER_TASK",
    "PROMPT_TASKS",
    "Responder",
]

INVALID_REPLY_MARKER = "Your previous reply was invalid"
# The reasoner's note in place of condensed history: "[Condensed history] 12 earlier ...".
CONDENSED_MARKER = "[Condensed history]"
_CONDENSED = re.compile(r"^\[Condensed history\] (\d+) earlier")
_TEMPLATE_KEYS = ("last_tool_output", "last_user_message", "nth", "task", "turn")
# What /prompts keeps: bounded, for load tests with hundreds of agents run on this server too.
PROMPTS_PER_TASK = 4
PROMPT_TASKS = 64
_REPEAT = re.compile(r"\{\{repeat:(\d{1,9}):(.*?)\}\}", re.DOTALL)


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
    last_user_message: str = ""  # the latest user message (the task, or one sent since)
    prompt_chars: int = 0
    offers_tools: bool = False
    key: str = field(default="")


def _read_conversation(body: dict[str, Any]) -> _Conversation:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list")
    conv = _Conversation(messages=messages, offers_tools=bool(body.get("tools")))
    first_user_seen = False
    last_tool: str | None = None
    last_user_after_task: str | None = None
    for msg in messages:
        if not isinstance(msg, dict):
            raise HttpError(400, "every message must be an object")
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
                if not text.startswith((INVALID_REPLY_MARKER, CONDENSED_MARKER)):
                    conv.last_user_message = text
                if text.startswith(INVALID_REPLY_MARKER):
                    conv.replies_so_far += 1
                condensed = _CONDENSED.match(text)
                if condensed:
                    conv.replies_so_far += int(condensed.group(1))
    conv.prompt_chars += len(json.dumps(body.get("tools") or ""))
    conv.last_tool_output = last_tool if last_tool is not None else last_user_after_task or ""
    conv.last_tool_output = conv.last_tool_output.rstrip()
    conv.last_user_message = conv.last_user_message or conv.task
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


class Responder:
    """Turns a chat request into the scripted reply; thread-safe."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.limiter = Limiter(script.limits)
        self._failures: dict[tuple[str, int], int] = {}
        # How often each turn of each conversation was answered: `{{nth}}` (forks of one task
        # reach the same turn; a script can answer each differently).
        self._answered: dict[tuple[str, int], int] = {}
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

    def reply(self, body: dict[str, Any]) -> Reply:
        try:
            conv = _read_conversation(body)
        except HttpError:
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

    def _answer(self, conv: _Conversation, prompt_tokens: int) -> Reply:
        script_conv = self.script.conversation_for(conv.task)
        if script_conv is None:
            raise HttpError(400, f"no conversation of the script matches the task {conv.task!r}")
        window = script_conv.context_window
        if window is not None and prompt_tokens > window:
            # Worded as OpenAI words it: litellm maps it to ContextWindowExceededError.
            raise HttpError(
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

        with self._lock:
            nth = self._answered[conv.key, index] = self._answered.get((conv.key, index), 0) + 1
        values = {
            "last_tool_output": conv.last_tool_output,
            "last_user_message": conv.last_user_message,
            "nth": str(nth),
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
        return Reply(
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
            raise HttpError(
                turn.fail_status,
                f"scripted failure {seen + 1} of {turn.fail_times}",
                kind="server_error" if turn.fail_status >= 500 else "rate_limit_error",
                retry_after_s=turn.fail_retry_after_s,
            )
