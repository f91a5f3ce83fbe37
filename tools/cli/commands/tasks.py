"""The commands that list, show, read and delete tasks: `deckhands tasks`, `show`, `logs` (and
`logs -f`, which follows) and `delete`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.prompt import Confirm
from rich.text import Text

from ..client import ENDED_STATES, ApiError
from ..common import Exit, TaskId, call, console, fail, options
from ..follow import Follower
from ..render import event_renderable, task_table, task_view

__all__ = ["delete", "logs", "show", "tasks"]

_STATES = [
    "LOADING",
    "RUNNING",
    "AWAITING_USER_INPUT",
    "AWAITING_USER_CONFIRMATION",
    "USER_CONFIRMED",
    "USER_REJECTED",
    "PAUSED",
    "RATE_LIMITED",
    "FINISHED",
    "ERROR",
    "STOPPED",
    "REJECTED",
]


def tasks(
    ctx: typer.Context,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only these states (repeat).")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="Only with all these labels.")
    ] = None,
    active: Annotated[bool, typer.Option("--active", help="Only tasks not ended.")] = False,
    forked_from: Annotated[
        str | None, typer.Option("--forked-from", help="Only the forks of this task.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="The tasks as JSON.")] = False,
) -> None:
    """Your tasks, newest first."""
    states = [s.upper() for s in state or []]
    unknown = [s for s in states if s not in _STATES]
    if unknown:
        fail(f"unknown state {unknown[0]!r}; one of {', '.join(_STATES)}", Exit.USAGE)
    if active:
        states = [s for s in _STATES if s not in ENDED_STATES and (not states or s in states)]
    found: list[dict[str, Any]] = []
    cursor = None
    with options(ctx).client() as client:
        while len(found) < limit:
            page = call(
                client.tasks,
                states=states,
                labels=label or [],
                limit=min(100, limit - len(found)),
                cursor=cursor,
                forked_from=forked_from,
            )
            found += page["tasks"]
            cursor = page["next_cursor"]
            if not cursor:
                break
    if as_json:
        print(json.dumps(found, indent=2))
        return
    if not found:
        console.print(Text("no task matches", style="dim"))
        return
    console.print(task_table(found, console.width))
    if cursor:
        console.print(Text(f"(more: --limit {limit * 2})", style="dim"))


def show(
    ctx: typer.Context,
    task_id: TaskId,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A task's state, usage, pending action and result."""
    with options(ctx).client() as client:
        task = call(client.task, task_id)
    if as_json:
        print(json.dumps(task, indent=2))
    else:
        console.print(task_view(task))


def logs(
    ctx: typer.Context,
    task_id: TaskId,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep following until the task ends.")
    ] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Only events after this seq.")] = 0,
    timeout: Annotated[float | None, typer.Option("--timeout")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Events as JSON lines.")] = False,
) -> None:
    """A task's events; with -f, live until it ends (exit code by its final state)."""
    with options(ctx).client() as client:
        if follow:
            follower = Follower(
                client, task_id, timeout_s=timeout, interactive=False, as_json=as_json
            )
            raise typer.Exit(int(follower.run(after)))
        try:
            for event in client.history(task_id, after):
                if as_json:
                    print(json.dumps(event))
                else:
                    console.print(event_renderable(event))
        except ApiError as exc:
            fail(str(exc), Exit.REFUSED)


def delete(
    ctx: typer.Context,
    task_id: TaskId,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Stop the task if need be and remove it: its log, State, blobs and sub-tasks."""
    if not yes and not Confirm.ask(f"delete task {task_id} and its log for good?", console=console):
        raise typer.Exit(int(Exit.USAGE))
    with options(ctx).client() as client:
        call(client.delete, task_id)
    console.print(f"task {task_id} deleted")
