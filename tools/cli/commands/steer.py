"""The commands that steer a running task: `deckhands approve` and `reject` (the action awaiting
confirmation), `stop`, `pause`, `resume`, and `say` (a message to the agent)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich.text import Text

from ..common import Exit, TaskId, call, console, fail, options
from ..render import event_renderable

__all__ = ["approve", "pause", "reject", "resume", "say", "stop"]


def _confirmation(ctx: typer.Context, task_id: str, action_id: str | None, approve: bool) -> None:
    with options(ctx).client() as client:
        task = call(client.task, task_id)
        pending = task.get("pending_action")
        if task["state"] != "AWAITING_USER_CONFIRMATION" or not pending:
            fail(
                f"task {task_id} is {task['state']}: no action awaits a confirmation",
                Exit.REFUSED,
            )
        if action_id is not None and pending["id"] != action_id:
            fail(
                f"the action awaiting confirmation is {pending['id']}, not {action_id}",
                Exit.REFUSED,
            )
        call(client.confirm, task_id, pending["id"], approve)
    console.print(Text("approved:" if approve else "rejected:", style="bold"))
    console.print(event_renderable(pending))


def approve(
    ctx: typer.Context,
    task_id: TaskId,
    action: Annotated[
        str | None, typer.Option("--action", help="Only if this is the action waiting.")
    ] = None,
) -> None:
    """Let the action awaiting confirmation run."""
    _confirmation(ctx, task_id, action, True)


def reject(
    ctx: typer.Context,
    task_id: TaskId,
    action: Annotated[
        str | None, typer.Option("--action", help="Only if this is the action waiting.")
    ] = None,
) -> None:
    """Refuse the action awaiting confirmation (the agent is told, and goes on)."""
    _confirmation(ctx, task_id, action, False)


def _control(ctx: typer.Context, task_id: str, what: str, done: str) -> None:
    with options(ctx).client() as client:
        call(client.control, task_id, what)
    console.print(f"task {task_id}: {done}")


def stop(ctx: typer.Context, task_id: TaskId) -> None:
    """Stop the task for good (and its sub-tasks)."""
    _control(ctx, task_id, "stop", "stop asked")


def pause(ctx: typer.Context, task_id: TaskId) -> None:
    """Pause the task (an action already running completes)."""
    _control(ctx, task_id, "pause", "pause asked")


def resume(ctx: typer.Context, task_id: TaskId) -> None:
    """Resume a paused task."""
    _control(ctx, task_id, "resume", "resume asked")


def say(
    ctx: typer.Context,
    task_id: TaskId,
    message: Annotated[str, typer.Argument(help="The message ('-': read stdin).")],
) -> None:
    """Send the agent a message: an answer to its question, or more work for an ended task."""
    text = sys.stdin.read() if message == "-" else message
    if not text.strip():
        fail("the message is empty", Exit.USAGE)
    with options(ctx).client() as client:
        call(client.say, task_id, text)
    console.print(f"task {task_id}: message sent")
