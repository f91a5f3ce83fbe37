"""A review before the agent finishes (DECKHANDS_AGENT_REVIEW_FINISH, issue 29): the model's
first `finish` since the user last spoke is answered with the task's request and its own final
message, and it is asked to check its work; a second `finish` ends the task.

The 1.5B model finished after doing a part of a task (one file of three edited, a program
written but not run) and said it was done. SWE-agent asks for the same confirmation before it
submits. The review is an entry in the log like any step's answer, so a redelivered step or a
restarted reasoner asks once, never twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.commands import StepRequest
from shared.events import AgentFinishAction, ErrorObservation, EventSource, MessageAction

from .prompt import FINISH_REVIEW

__all__ = ["finish_review"]

_MAX_TASK_CHARS = 2000
_MAX_FINAL_CHARS = 500


def finish_review(
    step: StepRequest, event: Any, events: Sequence[Any], event_id: str
) -> ErrorObservation | None:
    """The review that answers the step instead of `event`, when `event` is the model's first
    finish since the user last spoke; None otherwise."""
    if not isinstance(event, AgentFinishAction):
        return None
    task, reviewed = "", False
    for logged in events:
        if isinstance(logged, MessageAction) and logged.source == EventSource.USER:
            task = task or logged.content
            reviewed = False  # a user's message: the next finish is reviewed again
        elif isinstance(logged, ErrorObservation) and logged.error_code == FINISH_REVIEW:
            reviewed = True
    if not task or reviewed:
        return None
    final = event.final_message.strip() or "(no message)"
    text = (
        "Before the task ends, check your work. The task was:\n"
        f"{task[:_MAX_TASK_CHARS]}\n"
        f"You were about to finish with: {final[:_MAX_FINAL_CHARS]}\n"
        "If a part of the task is not done, or you have not yet run or read what you made to "
        "see that it is right, do that now. If every part is done, call finish again."
    )
    return ErrorObservation(
        id=event_id,
        task_id=step.task_id,
        source=EventSource.AGENT,
        cause=step.id,
        error_code=FINISH_REVIEW,
        content=text,
        llm_usage=event.llm_usage,  # the finish's tokens were spent: they count
    )
