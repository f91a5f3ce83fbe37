"""A reply that holds several tool calls (issue 29): the first is the step's action and the rest
ride on it as its `planned` calls; each later step runs the next one without asking the model,
while the one before succeeded.

A small model often writes out a whole plan in one reply (create the file, fill it with a
command, read it, finish). Taking only the first call dropped the work and left the model
believing it was done: the 1.5B model created an empty unique.txt and finished ("no
duplicates found"). OpenHands runs every call of a reply in turn. Here a call that fails, or a
user's message or a loop hint meanwhile, drops the rest and the model is asked again, and a
planned `finish` is never run: the model finishes once it has seen the results.

The plan is in the log (the action's `planned` field), so a redelivered or restarted step
takes the same next call: nothing lives only in the reasoner's memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from shared.events import (
    AgentThinkAction,
    CmdOutputObservation,
    FileEditObservation,
    FileReadObservation,
    FileWriteObservation,
    LoopHintObservation,
    MessageAction,
    PlannedCall,
    PythonOutputObservation,
    TaskTrackerAction,
    WorkspaceUploadedObservation,
)

from .errors import BadReply
from .prompt import answers_by_action
from .tools import AgentToolAction, ToolCall, action_for_call

__all__ = ["next_planned_action", "with_planned_calls"]

# Stops a plan: the model ends the task itself once it has seen what its calls did.
_NOT_PLANNED = frozenset({"finish"})
# What the agent may not have expected: after these, the model is asked again.
_INTERRUPTIONS = (MessageAction, LoopHintObservation, WorkspaceUploadedObservation)


def with_planned_calls(
    action: AgentToolAction, later: Sequence[ToolCall], fields: dict[str, Any], limit: int
) -> AgentToolAction:
    """`action` carrying the valid calls that followed it in its reply, `limit` at most: the
    list ends at a finish or at the first call that is not valid."""
    if action.kind == "finish" or limit <= 0:
        return action
    planned: list[PlannedCall] = []
    for call in later[:limit]:
        if call.name in _NOT_PLANNED or not _valid(call, fields):
            break
        arguments = call.arguments if isinstance(call.arguments, str) else _json(call.arguments)
        planned.append(PlannedCall(tool=call.name, arguments=arguments))
    return action.model_copy(update={"planned": tuple(planned)}) if planned else action


def next_planned_action(events: Sequence[Any], fields: dict[str, Any]) -> AgentToolAction | None:
    """The next call of the plan the agent's last action carries, if that action succeeded and
    nothing came between; None otherwise (the model is asked)."""
    last_at = _last_agent_call(events)
    if last_at is None:
        return None
    last = events[last_at]
    after = events[last_at + 1 :]
    if not last.planned or any(_interrupts(e) for e in after):
        return None
    if not isinstance(last, AgentThinkAction | TaskTrackerAction):
        if not _succeeded(answers_by_action(events).get(last.id)):
            return None
    first, *rest = last.planned
    try:
        action = action_for_call(ToolCall(first.tool, first.arguments), fields)
    except BadReply:
        return None
    return action.model_copy(update={"planned": tuple(rest)})


def _last_agent_call(events: Sequence[Any]) -> int | None:
    for at in range(len(events) - 1, -1, -1):
        event = events[at]
        if getattr(event, "tool_call_id", None) and hasattr(event, "planned"):
            return at
    return None


def _interrupts(event: Any) -> bool:
    # A reply of the model's since (an invalid one) means it has been asked again already.
    return isinstance(event, _INTERRUPTIONS) or getattr(event, "llm_usage", None) is not None


def _succeeded(answer: Any) -> bool:
    if isinstance(answer, CmdOutputObservation):
        return answer.exit_code == 0 and not answer.timed_out
    if isinstance(answer, PythonOutputObservation):
        return answer.exit_code == 0
    return isinstance(answer, FileWriteObservation | FileEditObservation | FileReadObservation)


def _valid(call: ToolCall, fields: dict[str, Any]) -> bool:
    try:
        action_for_call(call, fields)
    except BadReply:
        return False
    return True


def _json(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, ensure_ascii=False)
