"""From a task's event log to the chat messages the LLM sees.

Two shapes, one per tool-calling mode:
- native: agent actions are assistant messages with `tool_calls`, and each call is followed by
  exactly one `tool` message (its observation, or a placeholder) since providers reject anything
  else;
- prompt-based: tools are described in the system prompt, a call is the JSON object the model
  wrote, and its observation comes back as a user message.

Every event after the task becomes one `Chunk` (an action with its result, a message, an
error; prompt_view.py), an observation worded as observation_text.py says. The latest
CondensationAction in the history hides the chunks up to its `forgotten_up_to_seq`: the prompt
is then the system prompt, the task, a note carrying the condensation's summary, and the chunks
after it. An action and its result share a chunk, so a tool call is never separated from its
result; a result whose call was condensed away is hidden.
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
    FileEditObservation,
    FileReadObservation,
    FileWriteAction,
    FileWriteObservation,
    LoopHintObservation,
    MCPCallObservation,
    MessageAction,
    PlanItem,
    PythonOutputObservation,
    SecurityVerdictObservation,
    TaskTrackerAction,
    UserRejectObservation,
    WorkspaceUploadedObservation,
)

from .errors import NoTaskError
from .instructions import RepoInstructions, with_instructions
from .observation_text import lines_written, observation_text
from .prompt_view import CONDENSED_PREFIX, Chunk, PromptView, latest_condensation
from .tools import call_for_action, describe_tools

__all__ = [
    "BAD_REPLY_ERROR",
    "CONDENSED_PREFIX",
    "FINISH_REVIEW",
    "INVALID_REPLY_PREFIX",
    "LLM_ERROR",
    "REPEATED_FAILURE",
    "Chunk",
    "PromptView",
    "answers_by_action",
    "build_messages",
    "latest_condensation",
    "prompt_view",
    "system_prompt",
]

log = logging.getLogger("deckhands.reasoner.prompt")

# error_code of the ErrorObservation for a reply that was not a valid action, and of the one
# for an LLM that could not be reached at all.
BAD_REPLY_ERROR = "bad_llm_reply"
LLM_ERROR = "llm_error"
# error_code of the reasoner's answer to a first finish: the request to check the work first
# (finish_review.py); shown to the model as the user's words.
FINISH_REVIEW = "finish_review"
# How a bad reply is reported to the model; the scripted LLM server counts these as turns.
INVALID_REPLY_PREFIX = "Your previous reply was invalid"

# What a small model most often gets wrong on small tasks, said once: where it is and what the
# sandbox has; that a file the task asks for must be written before it is run; to read what a
# command printed and fix a failure before finishing. (Told to "look at the files first", the
# 1.5B model ran the script it was asked to write, found none and finished.)
_SYSTEM = (
    "You are a coding agent in a Linux sandbox. The working directory is /workspace (the task's "
    "files, if any, are there). It has python, pip, pytest, git, make, jq, patch, diff and the "
    "usual shell tools.\n"
    "Solve the task yourself, step by step, one tool call per reply:\n"
    "1. Read the files the task names before you change them (cat); write new ones with "
    "write_file.\n"
    "2. Run them (execute_bash) and read the output. If something failed, fix it and run again.\n"
    "3. Read the task again: when the output shows it is done, call finish with a short message "
    "that gives the result (e.g. what was printed)."
)
_PROMPT_TOOLS = (
    "\n\nTools:\n{tools}\n\n"
    "To use a tool, reply with one JSON object and nothing else, for example:\n"
    '{{"tool": "write_file", "arguments": {{"path": "hello.py", "content": "print(\'hi\')\\n"}}}}'
)
_PLACEHOLDERS = {
    "think": "Your thought has been recorded.",
    "finish": "The task was marked as finished.",
}
_NO_RESULT = "(no result was recorded for this call)"
REPEATED_FAILURE = "You made this exact call before and it failed then too. Do something different."
_ANSWER_TYPES = (
    CmdOutputObservation,
    PythonOutputObservation,
    FileReadObservation,
    FileWriteObservation,
    FileEditObservation,
    ErrorObservation,
    UserRejectObservation,
    AgentDelegateObservation,
    MCPCallObservation,
)


def system_prompt(native: bool) -> str:
    return _SYSTEM if native else _SYSTEM + _PROMPT_TOOLS.format(tools=describe_tools())


def _is_agent_tool_action(event: object) -> bool:
    return (
        getattr(event, "source", None) == EventSource.AGENT
        and getattr(event, "tool_call_id", None) is not None
        and call_for_action(event) is not None
    )


def answers_by_action(events: Sequence[Any]) -> dict[str, Any]:
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


def plan_results(events: Sequence[Any]) -> dict[str, str]:
    """What each task_tracker call answers: the plan as it set it, or (view) as last set."""
    results: dict[str, str] = {}
    plan: list[PlanItem] = []
    for event in events:
        if isinstance(event, TaskTrackerAction):
            if event.command == "plan":
                plan = list(event.tasks)
            results[event.id] = plan_text(plan, updated=event.command == "plan")
    return results


def plan_text(plan: Sequence[PlanItem], updated: bool = False) -> str:
    if not plan:
        return "The plan is empty."
    marks = {"todo": "[ ]", "in_progress": "[~]", "done": "[x]"}
    lines = [
        f"{n}. {marks[item.status]} {item.title}" + (f" ({item.notes})" if item.notes else "")
        for n, item in enumerate(plan, 1)
    ]
    return ("Plan updated:\n" if updated else "The plan:\n") + "\n".join(lines)


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


def prompt_view(
    events: Sequence[Any],
    *,
    native: bool,
    max_observation_chars: int = 8000,
    instructions: RepoInstructions | None = None,
) -> PromptView:
    """The task's events in log order, as prompt pieces; the repository's instructions, if
    any, end the system prompt (instructions.py)."""
    task = next(
        (e for e in events if isinstance(e, MessageAction) and e.source == EventSource.USER),
        None,
    )
    if task is None:
        raise NoTaskError("the task's history has no user message")
    answers: dict[str, Any] = {**answers_by_action(events), **plan_results(events)}
    head = (
        {"role": "system", "content": with_instructions(system_prompt(native), instructions)},
        {"role": "user", "content": task.content + _first_look(events, answers)},
    )
    answered = {id(obs) for obs in answers.values()}
    known_ids = {e.id for e in events}
    chunks: list[Chunk] = []
    failed_calls: set[str] = set()
    for event in events:
        if event is task or id(event) in answered:
            continue
        messages, replies = _render(event, answers, known_ids, native, max_observation_chars)
        if messages and _is_agent_tool_action(event):
            messages = _note_repeated_failure(event, answers, messages, failed_calls)
        if messages:
            chunks.append(Chunk(getattr(event, "seq", None), tuple(messages), replies))
    condensation = latest_condensation(events)
    task_seq = task.seq or 0
    return PromptView(
        head=head,
        task_seq=task_seq,
        chunks=tuple(chunks),
        forgotten_up_to_seq=condensation.forgotten_up_to_seq if condensation else task_seq,
        summary=condensation.summary if condensation else "",
    )


def _first_look(events: Sequence[Any], answers: dict[str, Any]) -> str:
    """The working directory's listing that the system took before the agent's first step,
    as the end of the task's message; "" when none was taken. No command is shown: the 1.5B
    model, shown the listing as a call of its own, repeated it until it was stopped, and shown
    it as a message naming the command, wrote that message into the file it was to edit."""
    look = next((e for e in events if getattr(e, "on_agents_behalf", False)), None)
    obs = answers.get(look.id) if look is not None else None
    if not isinstance(obs, CmdOutputObservation):
        return ""
    listing = obs.content.strip()
    if not listing:
        return f"\n\nThe working directory, {obs.cwd}, is empty."
    return f"\n\nThe working directory, {obs.cwd}, holds:\n{_clip_listing(listing)}"


def _clip_listing(listing: str, limit: int = 4000) -> str:
    return listing if len(listing) <= limit else listing[:limit].rsplit("\n", 1)[0] + "\n..."


def _lines(text: str) -> str:
    return f"\n{text}" if text else ""


def _note_repeated_failure(
    event: Any, answers: dict[str, Any], messages: list[dict[str, Any]], failed: set[str]
) -> list[dict[str, Any]]:
    """A call that failed before and fails again says so. A small model at temperature 0 sees
    its own earlier call in the history and repeats it (the 1.5B model sent the same edit four
    times, reading the file in between, until the loop detector stopped the task)."""
    if not isinstance(answers.get(event.id), ErrorObservation):
        return messages
    key = json.dumps(call_for_action(event), sort_keys=True, default=str)
    if key not in failed:
        failed.add(key)
        return messages
    last = messages[-1]
    return [*messages[:-1], {**last, "content": f"{last['content']}\n{REPEATED_FAILURE}"}]


def _render(
    event: Any, answers: dict[str, Any], known_ids: set[str], native: bool, limit: int
) -> tuple[list[dict[str, Any]], int]:
    """The messages one event adds, and how many model replies they stand for."""
    if getattr(event, "on_agents_behalf", False):
        return [], 0  # the first look: its listing is part of the task's message
    if _is_agent_tool_action(event):
        name, args = call_for_action(event) or ("", {})
        obs = answers.get(event.id)
        if isinstance(obs, str):  # the plan a task_tracker call set or viewed
            text = obs
        elif obs is not None:
            text = observation_text(obs, limit)
            if (
                isinstance(event, FileWriteAction)
                and isinstance(obs, FileWriteObservation)
                and event.content_ref is None
            ):
                first, _, notes = text.partition("\n")  # "Wrote N bytes to P", notes
                text = first.rstrip(".") + lines_written(event.content) + _lines(notes)
        else:
            text = _PLACEHOLDERS.get(name, _NO_RESULT)
        return [
            _tool_call_message(event.thought, event.tool_call_id, name, args, native),
            _result_message(event.tool_call_id, name, text, native),
        ], 1
    if isinstance(event, MessageAction):
        if event.source == EventSource.USER:
            return [{"role": "user", "content": event.content}], 0
        if event.source == EventSource.AGENT:
            return [{"role": "assistant", "content": event.content}], 1
        return [], 0
    if isinstance(event, AgentThinkAction | AgentFinishAction):
        # Agent actions without a tool call (e.g. replayed ones) are just what it said.
        text = getattr(event, "final_message", "") or event.thought
        if event.source == EventSource.AGENT and text:
            return [{"role": "assistant", "content": text}], 1
        return [], 0
    if isinstance(event, LoopHintObservation):
        return [{"role": "user", "content": event.hint}], 0
    if isinstance(event, WorkspaceUploadedObservation):
        # A person put files into the workspace between two steps: the agent should know.
        where = f"/workspace/{event.path}" if event.path else "/workspace"
        text = f"[The user uploaded {event.files} file(s) into {where}.]"
        return [{"role": "user", "content": text}], 0
    if isinstance(event, ErrorObservation):
        if event.error_code == LLM_ERROR or event.cause in known_ids:
            # A failure the model had no part in, a second answer to an action, or the
            # controller refusing a user's request: none is a reply to the model.
            return [], 0
        if event.error_code == FINISH_REVIEW:
            return [{"role": "user", "content": event.content}], 1
        if event.error_code == BAD_REPLY_ERROR:
            text = f"{INVALID_REPLY_PREFIX}: {event.content}. Reply with one valid tool call."
            return [{"role": "user", "content": text}], 1
        return [{"role": "user", "content": f"Error: {event.content}"}], 0
    return [], 0


def build_messages(
    events: Sequence[Any], *, native: bool, max_observation_chars: int = 8000
) -> list[dict[str, Any]]:
    """The conversation for the next step, from the task's events in log order, as condensed
    by the latest CondensationAction among them."""
    return prompt_view(
        events, native=native, max_observation_chars=max_observation_chars
    ).messages()
