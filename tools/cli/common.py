"""What every `deckhands` command shares: the exit codes, the two consoles, the gateway options
the root command collects (and the client they make), and the way a command fails."""

from __future__ import annotations

from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from .client import ApiError, Client
from .config import ConfigError, Target, resolve

__all__ = [
    "Exit",
    "Options",
    "TaskId",
    "call",
    "console",
    "err_console",
    "fail",
    "options",
]


class Exit(IntEnum):
    FINISHED = 0
    ERROR = 1
    USAGE = 2
    STOPPED = 3
    REJECTED = 4
    AWAITS_INPUT = 5
    REFUSED = 6
    TIMEOUT = 124
    INTERRUPTED = 130


# The task argument of most commands.
TaskId = Annotated[str, typer.Argument(metavar="ID")]

console = Console(highlight=False)
# Messages are not wrapped: a line of them can be searched for as it is.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class Options:
    """The root command's --url, --api-key and --api-key-file, for its sub-commands."""

    def __init__(self, url: str | None, api_key: str | None, api_key_file: Path | None) -> None:
        self.url = url
        self.api_key = api_key
        self.api_key_file = api_key_file

    def target(self) -> Target:
        try:
            return resolve(self.url, self.api_key, self.api_key_file)
        except ConfigError as exc:
            fail(str(exc), Exit.USAGE)

    def client(self) -> Client:
        target = self.target()
        return Client(target.url, target.api_key)


def fail(message: str, code: Exit) -> NoReturn:
    err_console.print(Text(f"deckhands: {message}", style="red"))
    raise typer.Exit(int(code))


def options(ctx: typer.Context) -> Options:
    found = ctx.find_object(Options)
    return found if found is not None else Options(None, None, None)


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        fail(str(exc), Exit.REFUSED)
