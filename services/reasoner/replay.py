"""Replay (seed 002, ReplayManager): a task created with a trajectory gets that trajectory's
agent actions back, in order, instead of LLM calls.

Stateless, so any replica and a restarted reasoner agree: the next recorded action is the one
whose index is the number of agent actions already in the task's history. Only agent actions
are replayed; observations, user messages, state changes and condensations of the recording are
skipped (the services produce them again). Past the last recorded action the LLM takes over,
as in OpenHands.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from shared.commands import StepRequest
from shared.events import (
    ACTION_TYPES,
    ChangeAgentStateAction,
    CondensationAction,
    EventAdapter,
    EventSource,
    utc_now,
)

from .replies import step_event_id

__all__ = ["is_replayable", "recorded_actions", "replay_index", "replayed_action"]

log = logging.getLogger("deckhands.reasoner.replay")


def is_replayable(event: object) -> bool:
    """An action the agent (the LLM) chose: what a replay gives back, and what it counts."""
    return (
        isinstance(event, ACTION_TYPES)
        and not isinstance(event, ChangeAgentStateAction | CondensationAction)
        and getattr(event, "source", None) == EventSource.AGENT
    )


def recorded_actions(trajectory: Sequence[dict[str, Any]]) -> list[Any]:
    """The trajectory's agent actions, in order. Entries that are not valid events are left
    out, the same way on every step, so the count stays consistent."""
    actions = []
    for i, item in enumerate(trajectory):
        try:
            event = EventAdapter.validate_python(item)
        except ValidationError as exc:
            log.warning(
                "trajectory entry %d (%s) is not a valid event, skipped: %s",
                i,
                item.get("kind"),
                exc.errors()[0]["msg"],
            )
            continue
        if is_replayable(event):
            actions.append(event)
    return actions


def replay_index(history: Sequence[Any]) -> int:
    """How many recorded actions the task has been given already."""
    return sum(1 for event in history if is_replayable(event))


def replayed_action(
    step: StepRequest, trajectory: Sequence[dict[str, Any]], history: Sequence[Any]
) -> Any | None:
    """The recorded action that answers `step`, or None once the trajectory is used up.

    It keeps what was recorded (command, path, content, thought, tool_call_id...) and becomes
    this step's answer: the step's event id and task, cause = the step, no seq yet, a fresh
    timestamp and no LLM usage (nothing was spent).
    """
    actions = recorded_actions(trajectory)
    index = replay_index(history)
    if index >= len(actions):
        return None
    return actions[index].model_copy(
        update={
            "id": step_event_id(step),
            "task_id": step.task_id,
            "cause": step.id,
            "seq": None,
            "timestamp": utc_now(),
            "llm_usage": None,
        }
    )
