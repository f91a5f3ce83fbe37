"""Repository instructions (AGENTS.md) join the system prompt, and the first action whose prompt
held them records it (services/reasoner/instructions.py)."""

from __future__ import annotations

import hashlib

import pytest

from services.reasoner.instructions import MAX_INSTRUCTION_CHARS, RepoInstructions, noting
from services.reasoner.prompt import prompt_view, system_prompt
from shared.events import (
    CmdRunAction,
    ErrorObservation,
    EventSource,
    InstructionsUsed,
    MessageAction,
)

pytestmark = pytest.mark.timeout(30)

T = "task1"
TASK = MessageAction(task_id=T, seq=2, source=EventSource.USER, content="fix the tests")
RULES = RepoInstructions.of("AGENTS.md", "Run the tests with `make check`.\n")


def test_the_instructions_end_the_system_prompt() -> None:
    plain = prompt_view([TASK], native=True).messages()
    told = prompt_view([TASK], native=True, instructions=RULES).messages()
    assert plain[0]["content"] == system_prompt(True)
    assert told[0]["content"].startswith(system_prompt(True))
    assert "# Repository instructions (AGENTS.md)" in told[0]["content"]
    assert "Run the tests with `make check`." in told[0]["content"]
    assert told[1:] == plain[1:]  # the conversation itself is unchanged
    blank = prompt_view([TASK], native=True, instructions=RepoInstructions.of("AGENTS.md", " \n"))
    assert blank.messages()[0]["content"] == system_prompt(True)


def test_the_text_is_bounded() -> None:
    long = RepoInstructions.of("AGENTS.md", "x" * (MAX_INSTRUCTION_CHARS + 10))
    assert len(long.text) == MAX_INSTRUCTION_CHARS


def test_the_first_action_that_used_them_records_it_once() -> None:
    action = CmdRunAction(task_id=T, source=EventSource.AGENT, command="make check")
    first = noting(action, RULES, [TASK])
    expected = InstructionsUsed(
        path="AGENTS.md",
        sha256=hashlib.sha256(RULES.text.encode()).hexdigest(),
        bytes=len(RULES.text.encode()),
    )
    assert first.instructions == expected
    # Once logged, later actions do not repeat it.
    again = CmdRunAction(task_id=T, source=EventSource.AGENT, command="ls")
    assert noting(again, RULES, [TASK, first]).instructions is None
    # Changed instructions are recorded again.
    changed = RepoInstructions.of("AGENTS.md", "Use tox.\n")
    assert noting(again, changed, [TASK, first]).instructions.sha256 != expected.sha256
    # No instructions, or no model action to carry the record: unchanged.
    assert noting(action, None, [TASK]) is action
    error = ErrorObservation(task_id=T, source=EventSource.AGENT, content="bad reply")
    assert noting(error, RULES, [TASK]) is error
