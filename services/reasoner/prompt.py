"""From a task's event log to the chat messages the LLM sees.

Two shapes, one per tool-calling mode:
- native: agent actions are assistant messages with `tool_calls`, and each call is followed by
  exactly one `tool` message (its observation, or a placeholder) since providers reject anything
  else;
- prompt-based: tools are described in the system prompt, a call is the JSON object the model
  wrote, and its observation comes back as a user message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from shared.events import (
    AgentDelegateObservation,
    AgentFinishAction,
    AgentThinkAction,
    CmdOutputObservation,
    ErrorObservation,
    EventSource,
    FileReadObservation,
    FileWriteObservation,
    MessageAction,
    PythonOutputObservation,
    SecurityVerdictObservation,
    UserRejectObservation,
)

from .tools import call_for_action, describe_tools

__all__ = [
    "BAD_REPLY_ERROR",
    "INVALID_REPLY_PREFIX",
    "LLM_ERROR",
    "NoTaskError",
    "build_messages",
    "system_prompt",
]

log = logging.getLogger("deckhands.reasoner.prompt")

# error_code of the ErrorObservation for a reply that was not a valid action, and of the one
# for an LLM that could not be reached at all.
BAD_REPLY_ERROR = "bad_llm_reply"
LLM_ERROR = "llm_error"
# How a bad reply is reported to the model; the scripted LLM server counts these as turns.
INVALID_REPLY_PREFIX = "Your previous reply was invalid"

_SYSTEM = (
    "You are a coding agent working in a Linux sandbox; your working directory is /workspace. "
    "Solve the user's task step by step with the tools, one tool call per reply: write files, "
    "run them, check the output. When the task is done, call finish with a short message that "
    "gives the result."
)
_PROMPT_TOOLS = (
    "\n\nTools:\n{tools}\n\n"
    "To use a tool, reply with one JSON object and nothing else, for example:\n"
    '{{"tool": "execute_bash", "arguments": {{"command": "ls"}}}}'
)
_PLACEHOLDERS = {
    "think": "Your thought has been recorded.",
    "finish": "The task was marked as finished.",
}
_NO_RESULT = "(no result was recorded for this call)"
_ANSWER_TYPES = (
    CmdOutputObservation,
    PythonOutputObservation,
    FileReadObservation,
    FileWriteObservation,
    ErrorObservation,
    UserRejectObservation,
    AgentDelegateObservation,
)


class NoTaskError(ValueError):
    """The history has no user message to start from."""


def system_prompt(native: bool) -> str:
    return _SYSTEM if native else _SYSTEM + _PROMPT_TOOLS.format(tools=describe_tools())


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit * 2 // 3, limit // 3
    omitted = len(text) - head - tail
    return f"{text[:head]}\n[... {omitted} characters omitted ...]\n{text[-tail:]}"


def _observation_text(obs: object, limit: int) -> str:
    if isinstance(obs, CmdOutputObservation):
        status = f"[exit code {obs.exit_code}, cwd {obs.cwd}"
        status += ", timed out]" if obs.timed_out else "]"
        return f"{_clip(obs.content, limit).rstrip()}\n{status}".lstrip("\n")
    if isinstance(obs, PythonOutputObservation):
        return f"{_clip(obs.content, limit).rstrip()}\n[exit code {obs.exit_code}]".lstrip("\n")
    if isinstance(obs, FileReadObservation):
        return _clip(obs.content, limit)
    if isinstance(obs, FileWriteObservation):
        return obs.content or f"Wrote {obs.path}."
    if isinstance(obs, ErrorObservation):
        return f"ERROR: {_clip(obs.content, limit)}"
    if isinstance(obs, UserRejectObservation):
        return f"REJECTED: {obs.content}"
    if isinstance(obs, AgentDelegateObservation):
        text = f"The helper's task ended in state {obs.agent_state.value}."
        if obs.content:
            text += f"\n{_clip(obs.content, limit)}"
        if obs.outputs:
            text += f"\nOutputs: {_clip(json.dumps(obs.outputs), limit)}"
        return text
    return _clip(str(getattr(obs, "content", "")), limit)


def _is_agent_tool_action(event: object) -> bool:
    return (
        getattr(event, "source", None) == EventSource.AGENT
        and getattr(event, "tool_call_id", None) is not None
        and call_for_action(event) is not None
    )


def _answers(events: Sequence[Any]) -> dict[str, Any]:
    """For each tool-call action id, the first observation that answers it.

    A security verdict is not an answer: a denied action is answered by the ErrorObservation
    that follows it, whose cause may be the action or the verdict itself.
    """
    action_ids = {e.id for e in events if _is_agent_tool_action(e)}
    verdicts = _verdicts(events)
    answers: dict[str, Any] = {}
    for event in events:
        if not isinstance(event, _ANSWER_TYPES):
            continue
        cause = _action_answered(event, verdicts)
        if cause is not None and cause in action_ids and cause not in answers:
            answers[cause] = event
    return answers


def _verdicts(events: Sequence[Any]) -> dict[str, str | None]:
    return {e.id: e.cause for e in events if isinstance(e, SecurityVerdictObservation)}


def _action_answered(event: Any, verdicts: dict[str, str | None]) -> str | None:
    """The action an observation answers, looking through a verdict it may point at."""
    return verdicts.get(event.cause, event.cause) if event.cause else None


def _tool_call_message(
    thought: str, call_id: str, name: str, args: dict[str, Any], native: bool
) -> dict[str, Any]:
    if native:
        return {
            "role": "assistant",
            "content": thought or None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        }
    call = json.dumps({"tool": name, "arguments": args})
    return {"role": "assistant", "content": f"{thought}\n{call}" if thought else call}


def _result_message(call_id: str, name: str, text: str, native: bool) -> dict[str, Any]:
    if native:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    return {"role": "user", "content": f"Result of {name}:\n{text}"}


def build_messages(
    events: Sequence[Any], *, native: bool, max_observation_chars: int = 8000
) -> list[dict[str, Any]]:
    """The conversation for the next step, from the task's events in log order."""
    task = next(
        (e for e in events if isinstance(e, MessageAction) and e.source == EventSource.USER),
        None,
    )
    if task is None:
        raise NoTaskError("the task's history has no user message")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system_prompt(native)},
        {"role": "user", "content": task.content},
    ]
    answers = _answers(events)
    answered = {id(obs) for obs in answers.values()}
    known_ids = {e.id for e in events}

    for event in events:
        if event is task or id(event) in answered:
            continue
        if _is_agent_tool_action(event):
            name, args = call_for_action(event) or ("", {})
            messages.append(
                _tool_call_message(event.thought, event.tool_call_id, name, args, native)
            )
            obs = answers.get(event.id)
            if obs is not None:
                text = _observation_text(obs, max_observation_chars)
            else:
                text = _PLACEHOLDERS.get(name, _NO_RESULT)
            messages.append(_result_message(event.tool_call_id, name, text, native))
        elif isinstance(event, MessageAction):
            if event.source == EventSource.USER:
                messages.append({"role": "user", "content": event.content})
            elif event.source == EventSource.AGENT:
                messages.append({"role": "assistant", "content": event.content})
        elif isinstance(event, AgentThinkAction | AgentFinishAction):
            # Agent actions without a tool call (e.g. replayed ones) are just what it said.
            text = getattr(event, "final_message", "") or event.thought
            if event.source == EventSource.AGENT and text:
                messages.append({"role": "assistant", "content": text})
        elif isinstance(event, ErrorObservation):
            if event.error_code == LLM_ERROR or event.cause in known_ids:
                # A failure the model had no part in, a second answer to an action, or the
                # controller refusing a user's request: none is a reply to the model.
                continue
            if event.error_code == BAD_REPLY_ERROR:
                text = f"{INVALID_REPLY_PREFIX}: {event.content}. Reply with one valid tool call."
            else:
                text = f"Error: {event.content}"
            messages.append({"role": "user", "content": text})
    return messages
