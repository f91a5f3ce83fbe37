"""The `deckhands` command: post tasks to a deckhands gateway, follow them live, steer them.

    deckhands run "Write a Python script that prints the squares of 1 to 10 and run it"
    deckhands tasks --state RUNNING --label team=payments
    deckhands logs -f <id>
    deckhands approve <id>            # or reject, stop, pause, resume
    deckhands say <id> "use port 8080"
    deckhands fork <id> --at 12 -n 3 "try another way"
    deckhands rewind <id> --to 12      # a paused or ended task, back to seq 12

The gateway's URL and the API key come from --url / --api-key, else DECKHANDS_URL /
DECKHANDS_API_KEY, else ~/.config/deckhands/config.toml (`url = ...`, `api_key = ...`), else,
in a deckhands checkout, http://127.0.0.1:8000 and the key `make up` wrote to .run/api_key.

Exit codes of `run` and `logs -f` (the task's final state): 0 FINISHED, 1 ERROR, 3 STOPPED,
4 REJECTED, 5 the agent asks a question and nobody is at the keyboard (answer with `say`);
every command: 2 bad usage, 6 the gateway refused the request or could not be reached,
124 --timeout passed, 130 Ctrl-C (the task goes on).
"""

# The docstring above is the root command's help (`deckhands --help`). This module is the root:
# the Typer app, its global options, and the sub-commands (tools/cli/commands/) registered in
# the order the help lists them. Exit codes, consoles and shared helpers: tools/cli/common.py;
# following a task live: tools/cli/follow.py.

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .commands import files, forks, run, steer, tasks
from .common import Exit, Options

__all__ = ["Exit", "app", "main"]

app = typer.Typer(
    name="deckhands",
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)


@app.callback()
def _global(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", help="The gateway (default: DECKHANDS_URL, config).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="An API key (default: DECKHANDS_API_KEY, config)."),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help="A file holding the API key.")
    ] = None,
) -> None:
    ctx.obj = Options(url, api_key, api_key_file)


# In this order in `deckhands --help`; each command is named after its function.
for _command in (
    run.run,
    run.login,
    tasks.tasks,
    tasks.show,
    tasks.logs,
    steer.approve,
    steer.reject,
    steer.stop,
    steer.pause,
    steer.resume,
    steer.say,
    forks.fork,
    forks.rewind,
    files.trajectory,
    files.workspace,
    files.upload,
    files.diff,
    tasks.delete,
):
    app.command()(_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
