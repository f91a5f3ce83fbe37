"""From an LLM reply to the one event the reasoner answers a step with.

Native tool calls are used when present; otherwise the text is searched for calls written out
(text_calls.py). The first call is the step's action; the calls after it ride on it as its plan
(planned_calls.py). Text with no tool call is a question for the user. Anything malformed
becomes an ErrorObservation.

Also the reasoner's other messages to the controller: a CondensationAction (the condenser's
answer to a step), and the RATE_LIMITED notice sent while an LLM call waits out a rate limit.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from shared.commands import StepRequest
from shared.events import (
    AgentState,
    BlobRef,
    ChangeAgentStateAction,
    CondensationAction,
    ErrorObservation,
    EventSource,
    FileWriteAction,
    LLMUsage,
    MessageAction,
)

from .errors import BadReply
from .planned_calls import next_planned_action, with_planned_calls
from .prompt import BAD_REPLY_ERROR, LLM_ERROR
from .text_calls import parse_text_tool_call, parse_text_tool_calls
from .tools import (
    AgentToolAction,
    ToolCall,
    action_for_call,
)

__all__ = [
    "FIRST_LOOK_THOUGHT",
    "NO_TOOL_CALL",
    "KeepContent",
    "LLMReply",
    "ReasonerEvent",
    "ReasonerMessage",
    "bounded_event",
    "condensation_event",
    "event_for_reply",
    "first_look_event",
    "keep_large_write",
    "llm_error_event",
    "parse_text_tool_call",
    "parse_text_tool_calls",
    "planned_event",
    "rate_limited_event",
    "rate_limited_event_id",
    "reply_event",
    "step_event_id",
]

# The one event that answers a step.
ReasonerEvent = AgentToolAction | MessageAction | ErrorObservation | CondensationAction
# Everything the reasoner sends the controller: answers, and RATE_LIMITED notices meanwhile.
ReasonerMessage = ReasonerEvent | ChangeAgentStateAction

# What a prompt-based model is told when it replied with text that is neither a tool call nor
# a question for the user.
NO_TOOL_CALL = (
    "the reply called no tool. If the task is done, call finish with the result as its message; "
    "otherwise call the tool for the next step; to ask the user something, write a question"
)

# Event ids derive from the step request's id: a redelivered step publishes the same id, and
# JetStream's Nats-Msg-Id dedup keeps a single answer.
_STEP_NS = uuid.UUID("5b0f3c2e-8d4a-4f63-9e57-2c1d7a6b9e10")


@dataclass(frozen=True)
class LLMReply:
    """What the model answered, provider-neutral."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: LLMUsage | None = None


def step_event_id(step: StepRequest) -> str:
    return uuid.uuid5(_STEP_NS, step.id).hex


def rate_limited_event_id(step: StepRequest, attempt: int) -> str:
    """The same for every delivery of the step: a redelivered step's notices are deduplicated."""
    return uuid.uuid5(_STEP_NS, f"{step.id}:rate-limited:{attempt}").hex


def _fields(
    step: StepRequest, usage: LLMUsage | None, thought: str, call_id: str | None
) -> dict[str, Any]:
    return {
        "id": step_event_id(step),
        "task_id": step.task_id,
        "source": EventSource.AGENT,
        "cause": step.id,
        "thought": thought,
        "tool_call_id": call_id,
        "llm_usage": usage,
    }


def _bad_reply(step: StepRequest, problem: str, usage: LLMUsage | None) -> ErrorObservation:
    return ErrorObservation(
        id=step_event_id(step),
        task_id=step.task_id,
        source=EventSource.AGENT,
        cause=step.id,
        error_code=BAD_REPLY_ERROR,
        content=problem,
        llm_usage=usage,  # a bad reply still cost tokens; it counts toward the budget
    )


# NATS refuses a message over its max_payload (1 MiB by default), and an action travels inside
# larger messages (the log entry, the review, the order to the runtime, the State's outbox).
DEFAULT_MAX_ACTION_BYTES = 256 * 1024


# Stores a task's content in the blob store and returns its claim check.
KeepContent = Callable[[str, bytes], Awaitable[BlobRef]]


def event_for_reply(
    step: StepRequest,
    reply: LLMReply,
    *,
    native: bool,
    max_action_bytes: int = DEFAULT_MAX_ACTION_BYTES,
) -> ReasonerEvent:
    """The one event that answers `step`, given what the model replied. Never raises.

    An action too large to carry becomes an ErrorObservation the agent sees, so it can try a
    smaller one; the task goes on."""
    event = reply_event(step, reply, native=native)
    return bounded_event(step, event, reply.usage, max_action_bytes)


def reply_event(
    step: StepRequest, reply: LLMReply, *, native: bool, planned_limit: int = 0
) -> ReasonerEvent:
    """The event the model's reply asks for, whatever its size, with up to `planned_limit`
    of the calls that followed its first as the action's plan (planned_calls.py). Never
    raises."""
    return _event_for_reply(step, reply, native=native, planned_limit=planned_limit)


async def keep_large_write(
    event: ReasonerEvent, keep: KeepContent, max_action_bytes: int, max_write_bytes: int
) -> ReasonerEvent:
    """A file write too large to travel in an event, with its content moved to the blob store
    (the event carries `content_ref`); any other event as it is."""
    if not isinstance(event, FileWriteAction) or event.content_ref is not None:
        return event
    data = event.content.encode()
    if len(data) > max_write_bytes or len(event.model_dump_json().encode()) <= max_action_bytes:
        return event
    ref = await keep(event.task_id, data)
    return event.model_copy(update={"content": "", "content_ref": ref})


def bounded_event(
    step: StepRequest, event: ReasonerEvent, usage: LLMUsage | None, max_action_bytes: int
) -> ReasonerEvent:
    """`event`, or the ErrorObservation telling the agent it was too large to carry."""
    size = len(event.model_dump_json().encode())
    if size <= max_action_bytes:
        return event
    return _bad_reply(
        step,
        f"your {getattr(event, 'kind', 'reply')} action is {size:,} bytes once encoded, over "
        f"the limit of {max_action_bytes:,} bytes, so it was not run. Split the work: write a "
        "large file in several parts (create, then append with further edits), or generate it "
        "with a short script.",
        usage,
    )


def _event_for_reply(
    step: StepRequest, reply: LLMReply, *, native: bool, planned_limit: int
) -> ReasonerEvent:
    content = (reply.content or "").strip()
    event_id = step_event_id(step)
    try:
        if reply.tool_calls:
            call, *later = reply.tool_calls
            fields = _fields(step, reply.usage, content, call.id or f"call_{event_id[:24]}")
            action = action_for_call(call, fields)
            return with_planned_calls(action, later, fields, planned_limit)
        found = parse_text_tool_calls(content, code_blocks=not native)
        if found is not None:
            (call, *later), rest = found
            # Prompt-based calls get an id too, so the observation links back to them.
            fields = _fields(step, reply.usage, rest, f"call_{event_id[:24]}")
            return with_planned_calls(action_for_call(call, fields), later, fields, planned_limit)
    except BadReply as exc:
        return _bad_reply(step, str(exc), reply.usage)
    if not content:
        return _bad_reply(step, "the reply was empty: call one of the tools", reply.usage)
    if not native and "?" not in content:
        # A small model without function calling often ends with its answer as plain text, or
        # says what it will do next without doing it. Either way nobody is asked anything, and
        # waiting for a person would end the task there: it is told to call a tool instead.
        return _bad_reply(step, NO_TOOL_CALL, reply.usage)
    return MessageAction(
        content=content, wait_for_response=True, **_fields(step, reply.usage, "", None)
    )


FIRST_LOOK_THOUGHT = "First, what the working directory holds."


def first_look_event(step: StepRequest, events: list[Any], command: str) -> ReasonerEvent | None:
    """The agent's first action when DECKHANDS_AGENT_FIRST_LOOK names one and the agent has
    not acted yet; None otherwise. No LLM call: the model's first prompt then shows the
    working directory. (The 1.5B model, not shown it, ran the script it was asked to write,
    wrote over files it had not read, and wrote a result from a JSON file it never opened.)"""
    if not command.strip() or any(getattr(e, "source", None) == EventSource.AGENT for e in events):
        return None
    call_id = f"call_{step_event_id(step)[:24]}"
    fields = _fields(step, None, FIRST_LOOK_THOUGHT, call_id)
    action = action_for_call(ToolCall("execute_bash", {"command": command}), fields)
    # Marked as the system's: the model's prompt shows its output as context, not as a call
    # of its own (the 1.5B model, shown one, repeated the listing until it was stopped).
    return action.model_copy(update={"on_agents_behalf": True})


def planned_event(step: StepRequest, events: list[Any]) -> ReasonerEvent | None:
    """The next call of the plan the model's last reply wrote out, when it is to run now
    (planned_calls.py); None when the model is to be asked. No LLM call."""
    fields = _fields(step, None, "", f"call_{step_event_id(step)[:24]}")
    return next_planned_action(events, fields)


def llm_error_event(step: StepRequest, problem: str) -> ErrorObservation:
    """The answer to a step whose LLM call failed on every delivery."""
    return ErrorObservation(
        id=step_event_id(step),
        task_id=step.task_id,
        source=EventSource.SYSTEM,
        cause=step.id,
        error_code=LLM_ERROR,
        content=f"the LLM could not be reached: {problem}",
    )


def condensation_event(
    step: StepRequest, forgotten_up_to_seq: int, summary: str
) -> CondensationAction:
    """The answer to a step whose prompt had to be condensed before the LLM could be asked."""
    return CondensationAction(
        id=step_event_id(step),
        task_id=step.task_id,
        source=EventSource.AGENT,
        cause=step.id,
        forgotten_up_to_seq=forgotten_up_to_seq,
        summary=summary,
    )


def rate_limited_event(
    step: StepRequest, attempt: int, wait_s: float, why: str = "LLM rate limit"
) -> ChangeAgentStateAction:
    """Tells the controller the step's LLM call is waiting out a rate limit (attempt 1, 2...),
    or for the model's shared capacity (attempt 0)."""
    if attempt == 0:
        reason = f"{why}: about {wait_s:.3g}s" if wait_s > 0 else why
    else:
        reason = f"{why}: retrying in {wait_s:.3g}s"
    return ChangeAgentStateAction(
        id=rate_limited_event_id(step, attempt),
        task_id=step.task_id,
        source=EventSource.SYSTEM,
        cause=step.id,
        agent_state=AgentState.RATE_LIMITED,
        reason=reason,
    )
