"""Helpers for the condenser's integration tests: a task that reads long files, one by one."""

from __future__ import annotations

from shared.events import CmdOutputObservation, CmdRunAction, EventSource

__all__ = ["READ_EVERY_PART", "part_output", "record_output"]

# The scripted model reads part1.txt, part2.txt... one per reply ({{turn}} counts its replies,
# condensed ones included), so the file it asks for tells how many replies it thinks it gave.
READ_EVERY_PART = [{"tool": "execute_bash", "arguments": {"command": "cat part{{turn}}.txt"}}]


def part_output(k: int) -> str:
    """About 2,200 characters, about 1,000 tokens."""
    return "".join(f"part {k} line {i}: value {i * k % 97} ok\n" for i in range(80))


def record_output(run: CmdRunAction, k: int) -> CmdOutputObservation:
    return CmdOutputObservation(
        task_id=run.task_id,
        source=EventSource.ENVIRONMENT,
        cause=run.id,
        command=run.command,
        content=part_output(k),
        exit_code=0,
        cwd="/workspace",
    )
