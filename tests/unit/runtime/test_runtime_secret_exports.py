"""A task's secrets reach its command through an `export` line the runtime puts in front: any
value (quotes, newlines, `$`, backslashes) arrives byte for byte, checked with a real bash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.runtime.task_secrets import python_exports, with_exports

VALUES = {
    "PLAIN": "abcd1234",
    "QUOTES": 'it\'s "quoted" `and` $(not run) $HOME',
    "LINES": "line one\nline two\n",
    "BACKSLASH": "C:\\path\\to\\x",
}


def test_values_arrive_unchanged_and_nothing_in_them_runs() -> None:
    command = with_exports('printf "%s\\0" "$PLAIN" "$QUOTES" "$LINES" "$BACKSLASH"', VALUES)
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", command],
        capture_output=True,
        timeout=10,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
    ).stdout.decode()
    assert out.split("\0")[:-1] == list(VALUES.values())


def test_no_secrets_leave_the_command_alone() -> None:
    assert with_exports("echo hi", {}) == "echo hi"


def test_the_python_cell_sets_the_same_values(tmp_path: Path) -> None:
    script = tmp_path / "cell.py"
    script.write_text(
        python_exports(VALUES)
        + "\nimport os, sys\n"
        + "sys.stdout.write('\\0'.join(os.environ[n] for n in "
        + repr(list(VALUES))
        + "))\n"
    )
    out = subprocess.run(
        [sys.executable, "-S", str(script)], capture_output=True, timeout=10, check=True, env={}
    ).stdout.decode()
    assert out.split("\0") == list(VALUES.values())
