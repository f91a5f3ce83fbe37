"""A task's secrets reach its commands and cells through the executor's `env`, beside the
command, never in it: any value (quotes, newlines, `$`, backslashes) arrives byte for byte,
nothing in it runs, and a shell with `set -x`, `set -v`, BASH_XTRACEFD, a DEBUG trap or
functions named like the builtins never prints one. Checked with the real executor and a real
bash, as a local process (tests/unit/runtime/test_sandbox_executor.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_sandbox_executor import Executor  # type: ignore[import-not-found]

from services.runtime.task_secrets import exported
from shared.secret_redaction import Redactor

VALUES = {
    "PLAIN": "abcd1234",
    "QUOTES": 'it\'s "quoted" `and` $(not run) $HOME',
    "LINES": "line one\nline two\n",
    "BACKSLASH": "C:\\path\\to\\x",
    "ODD": "tab\there \x01 é ~#,",
}
ALL = '"$PLAIN" "$QUOTES" "$LINES" "$BACKSLASH" "$ODD"'


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[Executor]:
    ex = Executor(tmp_path)
    yield ex
    ex.close()


def _bash(executor: Executor, command: str, env: dict[str, str] = VALUES) -> str:
    answer = executor.call("bash", command=command, env=env, timeout_s=20)
    assert answer["ok"], answer
    return str(answer["output"])


def test_values_arrive_unchanged_and_nothing_in_them_runs(executor: Executor) -> None:
    out = _bash(executor, f'printf "%s\\0" {ALL}')
    assert out.split("\0")[:-1] == list(VALUES.values())
    cell = executor.call(
        "python",
        code="import os\nprint(repr([os.environ[n] for n in " + repr(list(VALUES)) + "]))",
        env=VALUES,
    )
    assert cell["output"].strip() == repr(list(VALUES.values()))


def test_a_traced_or_verbose_shell_prints_no_value(executor: Executor, tmp_path: Path) -> None:
    trace = tmp_path / "trace.log"
    outputs = [
        _bash(executor, "set -x; echo traced"),
        _bash(executor, "echo still traced"),
        _bash(executor, "set -v"),
        _bash(executor, "echo verbose too"),
        _bash(executor, f"set +xv; exec 7>{trace}; BASH_XTRACEFD=7; set -x"),
        _bash(executor, "echo to fd 7"),
        _bash(executor, "set +x; trap 'echo \"DEBUG $BASH_COMMAND\"' DEBUG; set -T"),
        _bash(executor, "echo trapped"),
        _bash(executor, 'trap - DEBUG; export() { echo "EXPORTED $*"; }; read() { :; }'),
        _bash(executor, 'set() { echo "SET $*"; }; echo shadowed'),
    ]
    joined = "\n".join(outputs) + trace.read_text()
    assert "traced" in joined and "verbose too" in joined and "shadowed" in joined
    assert "++ echo to fd 7" in trace.read_text()  # the trace went there, and is checked
    for name, value in VALUES.items():
        redacted = Redactor({name: value}).text(joined)
        assert redacted == joined, f"{name} appears (in some form) in {joined!r}"
    # The flags the agent set are the agent's after the exports: restored, not lost.
    assert "x" in _bash(executor, "unset -f export read set; set -x; echo $-").split("\n")[-2]
    # And the values arrived, despite the agent's functions named `export`, `read`, `set`.
    assert _bash(executor, f'set +x; printf "%s\\0" {ALL}').split("\0")[:-1] == list(
        VALUES.values()
    )


def test_the_values_do_not_stay_on_disk(executor: Executor, tmp_path: Path) -> None:
    state = tmp_path / ".state"
    during = _bash(executor, f"wc -c < {state}/command.env; cat {state}/command.sh")
    assert during.split("\n")[0].strip() == "0"  # emptied before the command ran
    assert all(v not in during for v in VALUES.values())
    assert not (state / "command.env").exists()


def test_bad_env_is_refused_naming_the_variable_not_the_value(executor: Executor) -> None:
    for env in ({"1BAD": "value1"}, {"OK": "nul\0inside"}, {"A=B": "x"}):
        answer = executor.call("bash", command="echo never", env=env)
        assert answer["ok"] is False and answer["code"] == "bad_request"
        assert "value1" not in answer["error"] and "inside" not in answer["error"]
    assert _bash(executor, "echo fine", env={}) == "fine\n"


def test_input_to_a_running_program_gets_no_env(executor: Executor) -> None:
    started = executor.call(
        "bash", command="read line; echo got $line", env=VALUES, no_output_timeout_s=0.5
    )
    assert started["running"] is True
    answer = executor.call("bash", command="hello", is_input=True, env=VALUES, timeout_s=10)
    assert answer["output"] == "got hello\n"


def test_reserved_names_are_never_exported() -> None:
    kept = exported({"API_TOKEN": "t0ken", "PYTHONSTARTUP": "/x.py", "GIT_SSH_COMMAND": "sh"})
    assert kept == {"API_TOKEN": "t0ken"}
