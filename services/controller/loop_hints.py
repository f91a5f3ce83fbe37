"""What the agent is told when its steps repeat (issue 29): the pattern in words, and a way
out where the last result says what is wrong (a script run without its interpreter, a command
that is not there). Pure: text from the detector's pattern and the last result logged."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from shared.events import CmdOutputObservation, ErrorObservation, EventBase

__all__ = ["loop_hint"]

_PREFIX = "[deckhands] Your recent steps repeat"


def loop_hint(pattern: str, logged: Sequence[EventBase]) -> str:
    """The hint for `pattern`, given the entries logged in this turn (the last result, if the
    turn logged one)."""
    last = next(
        (e for e in reversed(logged) if isinstance(e, CmdOutputObservation | ErrorObservation)),
        None,
    )
    detail = _about(last) if last is not None else ""
    if pattern.startswith("monologue"):
        head = f"{_PREFIX}: you sent the same message three times."
        way = "Use a tool to make progress, or call finish if the task is done."
    elif pattern.startswith("repeating action"):
        head = f"{_PREFIX}: the same action, with the same result each time."
        way = "Repeating it will not change the result: do something different."
    elif pattern.startswith("repeating"):
        head = (
            f"{_PREFIX}: an action keeps giving the same result although you changed "
            "things in between, so what you change does not affect it."
        )
        way = "Read that result again, find what it says is wrong, and try another approach."
    else:
        head = f"{_PREFIX} ({pattern})."
        way = "Step back and try a different approach."
    return " ".join(part for part in (head, detail, way) if part)


def _about(result: CmdOutputObservation | ErrorObservation) -> str:
    if isinstance(result, ErrorObservation):
        return f"The last error: {_short(result.content)}"
    command, output = result.command.strip(), result.content
    printed = f": {_short(output)}" if output.strip() else " and printed nothing"
    said = f"`{_short(command, 120)}` exited with {result.exit_code}{printed}"
    if not output.strip() and _TO_FILE.search(command):
        said += " (its output went to a file: read the file to see what it holds)"
    script = _direct_script(command)
    if script is not None and (result.exit_code == 126 or "Permission denied" in output):
        runner = _interpreter(script)
        return (
            f"{said} {script} is not executable, so running it as `{command}` cannot work. Run "
            f"it with its interpreter instead (`{runner} {script}`), or make it executable "
            f"first (`chmod +x {script}`; it then needs a first line such as "
            f"`#!/usr/bin/env {runner}`)."
        )
    if result.exit_code == 127 or "command not found" in output:
        return (
            f"{said} That command is not there: check its name and where it is (`ls`), or "
            "run a script with its interpreter (`python3 file.py`, `bash file.sh`)."
        )
    at = _raised_at(output)
    if at is not None:
        path, line, code = at
        return (
            f"{said} The error is raised in {path}, line {line} (`{code}`): look at that "
            "file too, not only the one you were changing."
        )
    return said


# The last frame of a Python traceback that is in the workspace: where to look.
_FRAME = re.compile(r'File "(/workspace/[^"]+)", line (\d+)[^\n]*\n[ \t]*(\S[^\n]*)')


def _raised_at(output: str) -> tuple[str, int, str] | None:
    frames = _FRAME.findall(output)
    if not frames:
        return None
    path, line, code = frames[-1]
    return path.removeprefix("/workspace/"), int(line), _short(code, 120)


# `> out.txt`, `>> log`: not `2>&1` or `> /dev/null`.
_TO_FILE = re.compile(r">>?\s*(?!&|/dev/null)[^\s;|&]+")


def _direct_script(command: str) -> str | None:
    """The script a command runs by its path (`./fib.py args`), if it does."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words and re.fullmatch(r"(\./|/)[^\s;|&]+", words[0]):
        return words[0].removeprefix("./")
    return None


def _interpreter(script: str) -> str:
    if script.endswith(".py"):
        return "python3"
    if script.endswith(".js"):
        return "node"
    return "bash"


def _short(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
