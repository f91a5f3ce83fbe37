"""Repository instructions: the workspace's AGENTS.md (or .openhands/microagents/repo.md)
joins the system prompt.

The runtime reads the file when it checks a repository out or a tree is uploaded (bounded,
DECKHANDS_INSTRUCTIONS_MAX_BYTES) and keeps it in Redis (shared/workspace.py); each step reads
it from there (one Redis read). The first action whose prompt held a given text carries an
`instructions` record (path, SHA-256, bytes): the event log says what the agent was told.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.events import InstructionsUsed

__all__ = [
    "MAX_INSTRUCTION_CHARS",
    "RepoInstructions",
    "already_recorded",
    "noting",
    "with_instructions",
]

# The runtime bounds what it keeps; this bounds what a prompt takes whatever Redis holds.
MAX_INSTRUCTION_CHARS = 65_536


@dataclass(frozen=True)
class RepoInstructions:
    path: str
    text: str

    @classmethod
    def of(cls, path: str, text: str) -> RepoInstructions:
        return cls(path, text[:MAX_INSTRUCTION_CHARS])

    @property
    def record(self) -> InstructionsUsed:
        data = self.text.encode()
        return InstructionsUsed(
            path=self.path, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data)
        )

    def block(self) -> str:
        return (
            f"\n\n# Repository instructions ({self.path})\n"
            f"The repository in /workspace gives these instructions; follow them:\n\n"
            f"{self.text.strip()}\n"
        )


def with_instructions(system: str, instructions: RepoInstructions | None) -> str:
    return (
        system
        if instructions is None or not instructions.text.strip()
        else (system + instructions.block())
    )


def already_recorded(events: Sequence[Any], record: InstructionsUsed) -> bool:
    """Whether an earlier action of the task carries this very text's record."""
    for event in events:
        used = getattr(event, "instructions", None)
        if isinstance(used, InstructionsUsed) and used.sha256 == record.sha256:
            return True
    return False


def noting(event: Any, instructions: RepoInstructions | None, events: Sequence[Any]) -> Any:
    """`event` with the instructions' record if it is an agent action and the first whose
    prompt held this text."""
    if instructions is None or not instructions.text.strip():
        return event
    if "instructions" not in type(event).model_fields:
        return event  # an error observation: no model reply to attribute them to
    record = instructions.record
    if already_recorded(events, record):
        return event
    return event.model_copy(update={"instructions": record})
