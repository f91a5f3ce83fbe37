"""A task's history as prompt pieces: one Chunk per event after the task, and the PromptView
that holds them with the latest condensation that applies to them (prompt.py builds it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.events import CondensationAction, EventSource

__all__ = ["CONDENSED_PREFIX", "Chunk", "PromptView", "latest_condensation"]

# Starts the note that stands for condensed steps: "[Condensed history] 12 earlier steps...".
# The scripted LLM server reads the number to keep counting the model's replies.
CONDENSED_PREFIX = "[Condensed history]"


@dataclass(frozen=True)
class Chunk:
    """What one event adds to the prompt: an action with its result, a message, an error."""

    seq: int | None
    messages: tuple[dict[str, Any], ...]
    replies: int = 0  # model replies it stands for: 1 for an agent action or a bad reply


@dataclass(frozen=True)
class PromptView:
    """A task's history as prompt pieces, and the latest condensation that applies to them."""

    head: tuple[dict[str, Any], ...]  # the system prompt and the task
    task_seq: int
    chunks: tuple[Chunk, ...]  # every event after the task that shows in the prompt, in order
    forgotten_up_to_seq: int = 0
    summary: str = ""

    def forgets(self, chunk: Chunk, up_to_seq: int) -> bool:
        return chunk.seq is not None and self.task_seq < chunk.seq <= up_to_seq

    def kept(self, up_to_seq: int | None = None) -> list[Chunk]:
        cut = self.forgotten_up_to_seq if up_to_seq is None else up_to_seq
        return [c for c in self.chunks if not self.forgets(c, cut)]

    def summary_message(
        self, up_to_seq: int | None = None, summary: str | None = None
    ) -> dict[str, Any] | None:
        """The note standing for the condensed chunks, or None when nothing is condensed."""
        cut = self.forgotten_up_to_seq if up_to_seq is None else up_to_seq
        forgotten = [c for c in self.chunks if self.forgets(c, cut)]
        if not forgotten:
            return None
        text = self.summary if summary is None else summary
        steps = sum(c.replies for c in forgotten)
        note = f"{CONDENSED_PREFIX} {steps} earlier steps were condensed to fit the context window."
        if text:
            note += f" What happened in them:\n{text}"
        return {"role": "user", "content": note}

    def messages(
        self, up_to_seq: int | None = None, summary: str | None = None
    ) -> list[dict[str, Any]]:
        """The conversation: as condensed by the history, or with another cut and summary."""
        out = list(self.head)
        note = self.summary_message(up_to_seq, summary)
        if note is not None:
            out.append(note)
        for chunk in self.kept(up_to_seq):
            out.extend(chunk.messages)
        return out


def latest_condensation(events: Sequence[Any]) -> CondensationAction | None:
    return next(
        (
            e
            for e in reversed(events)
            if isinstance(e, CondensationAction) and e.source == EventSource.AGENT
        ),
        None,
    )
