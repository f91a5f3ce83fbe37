"""The commands that move a task's data: `deckhands trajectory` (its event log as JSON),
`workspace` (download), `upload` and `diff` (the workspace's changes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from ..common import TaskId, call, console, err_console, options
from ..render import diff_renderable

__all__ = ["diff", "trajectory", "upload", "workspace"]


def trajectory(
    ctx: typer.Context,
    task_id: TaskId,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write it here (default: stdout).")
    ] = None,
) -> None:
    """The task's whole event log as JSON (it can be posted back as a replay)."""
    with options(ctx).client() as client:
        data = call(client.trajectory, task_id)
    text = json.dumps(data, indent=2)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n")
        err_console.print(f"{len(data['events'])} events written to {output}")


def workspace(
    ctx: typer.Context,
    task_id: TaskId,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Default: workspace-ID.tar.gz, or the file's name."),
    ] = None,
    path: Annotated[
        str | None, typer.Option("--path", help="Only this file of the workspace.")
    ] = None,
) -> None:
    """Download the task's workspace as a tar.gz (or one file of it)."""
    if output is None:
        output = Path(Path(path).name if path else f"workspace-{task_id}.tar.gz")
    with options(ctx).client() as client:
        written = call(client.download_workspace, task_id, output, path)
    console.print(f"{written} bytes written to {output}")


def upload(
    ctx: typer.Context,
    task_id: TaskId,
    source: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="A .tar[.gz] or .zip, or a file.")
    ],
    path: Annotated[
        str | None,
        typer.Option("--path", help="Where in /workspace (an archive: under it; a file: as it)."),
    ] = None,
) -> None:
    """Upload into the task's workspace: an archive is extracted, another file written."""
    with options(ctx).client() as client:
        result = call(client.upload_workspace, task_id, source, path)
    console.print(f"task {task_id}: {result.get('files', '?')} file(s) written")


def diff(ctx: typer.Context, task_id: TaskId) -> None:
    """The changes in the task's workspace, as a git diff (against its repository's commit or
    the tree last uploaded)."""
    with options(ctx).client() as client:
        text = call(client.workspace_diff, task_id)
    if not console.is_terminal:
        sys.stdout.write(text)  # as it is: `deckhands diff ID | git apply` works
        return
    console.print(diff_renderable(text) if text else Text("no change", style="dim"))
