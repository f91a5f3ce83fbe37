"""A scripted-LLM script that solves the tasks with their reference solutions: one conversation
per task (matched on its prompt) that writes the solution's files, runs its command and finishes
with its answer. `DECKHANDS_STACK_LLM=scripted make eval` runs on it: the harness end to end,
instant and deterministic, every task passing (a figure about the harness, not about a model).
With `--scripted cheats` each conversation runs the task's cheat instead: every task fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .attempts import setup_prompt
from .tasks import EvalTask

__all__ = [
    "cheating_turns",
    "conversation",
    "setup_conversation",
    "solving_turns",
    "write_script",
]


def _turns(files: dict[str, str], command: str, message: str) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [
        {"tool": "write_file", "arguments": {"path": rel, "content": content}}
        for rel, content in files.items()
    ]
    if command:
        turns.append({"tool": "execute_bash", "arguments": {"command": command}})
    turns.append({"tool": "finish", "arguments": {"message": message}})
    return turns


def solving_turns(task: EvalTask) -> list[dict[str, Any]]:
    """The task's reference solution: its check passes."""
    return _turns(task.solution_files, task.solution, task.answer)


def cheating_turns(task: EvalTask) -> list[dict[str, Any]]:
    """The task's cheat (the expected result without the work), which says it is done: its
    check fails."""
    return _turns(task.cheat_files, task.cheat, task.cheat_answer or task.answer)


def conversation(task: EvalTask, turns: list[dict[str, Any]]) -> dict[str, Any]:
    """A conversation the scripted server picks for `task` (its prompt is in the first user
    message)."""
    return {"match": task.prompt, "turns": turns}


def setup_conversation(
    task: EvalTask, turns: Callable[[EvalTask], list[dict[str, Any]]] = solving_turns
) -> dict[str, Any]:
    """The set-up of `--attempts` (attempts.py): a look and a finish, then, in each fork (whose
    history holds those two replies), the task's solution (or other `turns`)."""
    look = {"tool": "execute_bash", "arguments": {"command": "ls -la"}}
    ready = {"tool": "finish", "arguments": {"message": "Ready."}}
    return {"match": setup_prompt(task), "turns": [look, ready, *turns(task)]}


def write_script(path: Path, conversations: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fallback = [{"tool": "finish", "arguments": {"message": "No script for this task."}}]
    path.write_text(
        json.dumps({"model": "scripted", "conversations": conversations, "turns": fallback})
    )
    return path
