"""`deckhands fork`: new tasks that start from a task's log and files at one of its seqs; and
`deckhands rewind`: a paused or ended task taken back to one of its seqs."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.text import Text

from ..common import Exit, TaskId, call, console, fail, options

__all__ = ["fork", "rewind"]


def fork(
    ctx: typer.Context,
    task_id: TaskId,
    message: Annotated[
        str | None,
        typer.Argument(help="Each fork's next message ('-': read stdin); none: the agent goes on."),
    ] = None,
    at: Annotated[
        int | None,
        typer.Option(
            "--at",
            min=1,
            help="The seq to fork at (`deckhands logs` shows them); default: the task's last.",
        ),
    ] = None,
    count: Annotated[int, typer.Option("--count", "-n", min=1, max=32, help="How many.")] = 1,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="A label for each fork (repeat).")
    ] = None,
    max_iterations: Annotated[
        int | None, typer.Option("--max-iterations", min=1, help="Default: the task's.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="The answer as JSON.")] = False,
) -> None:
    """Fork a task at a seq: each fork has its log up to there and its files of then."""
    text = sys.stdin.read() if message == "-" else message
    if text is not None and not text.strip():
        fail("the message is empty", Exit.USAGE)
    body: dict[str, Any] = {"count": count, "labels": label or []}
    if text is not None:
        body["message"] = text
    if max_iterations is not None:
        body["limits"] = {"max_iterations": max_iterations}
    with options(ctx).client() as client:
        if at is None:
            pages = list(client.history(task_id))
            if not pages:
                fail(f"task {task_id} has no log yet", Exit.REFUSED)
            at = int(pages[-1]["seq"])
        made = call(client.fork, task_id, {"at": at, **body})
    if as_json:
        print(json.dumps(made, indent=2))
        return
    files = made.get("checkpoint") or "an empty /workspace"
    console.print(Text(f"forked {task_id} at seq {at} (files: {files}):", style="bold"))
    for created in made["forks"]:
        console.print(created["id"])


def rewind(
    ctx: typer.Context,
    task_id: TaskId,
    to: Annotated[int, typer.Option("--to", min=1, help="The seq to go back to.")],
) -> None:
    """Take a paused or ended task back to a seq: its files of then, and on from there (the log
    keeps what came after)."""
    with options(ctx).client() as client:
        call(client.rewind, task_id, to)
    console.print(f"task {task_id}: rewind to seq {to} asked (deckhands logs -f {task_id})")
