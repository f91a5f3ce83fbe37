"""The in-sandbox executor's protocol and sessions, run as a local process (no Docker).

The executor is standard-library Python: the same package that runs in the image runs here,
with a temporary directory as its workspace.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.sandbox_protocol.messages import OPERATIONS, ErrorCode

ROOT = Path(__file__).resolve().parents[3]
SANDBOX = ROOT / "deploy" / "sandbox"  # holds the package, as /opt/deckhands does in the image
EXECUTOR = SANDBOX / "executor"
# holder.py's way in: the package's parent and (in the image, the same directory) the contract.
START = f"import sys; sys.path[:0] = [{str(SANDBOX)!r}, {str(ROOT)!r}]; import executor; "


def _module(name: str = "output") -> Any:
    """One of the executor's modules, imported here (as `sandbox_executor.<name>`)."""
    if "sandbox_executor" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "sandbox_executor", EXECUTOR / "__init__.py", submodule_search_locations=[str(EXECUTOR)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["sandbox_executor"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"sandbox_executor.{name}")


class Executor:
    def __init__(self, workspace: Path) -> None:
        env = {
            **os.environ,
            "DECKHANDS_WORKSPACE": str(workspace),
            "HOME": str(workspace / ".home"),
            "DECKHANDS_STATE_DIR": str(workspace / ".state"),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", START + "executor.main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=workspace,
        )
        self.n = 0

    def call(self, op: str, **fields: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.n += 1
        self.proc.stdin.write((json.dumps({"id": str(self.n), "op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert answer["id"] == str(self.n)
        return answer

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[Executor]:
    ex = Executor(tmp_path)
    yield ex
    ex.close()


def test_cut_middle_keeps_head_and_tail_and_counts() -> None:
    mod = _module()
    text = "a" * 50 + "b" * 50
    assert mod.cut_middle("", 0, text, 200) == text
    cut = mod.cut_middle("", 0, text, 20)
    assert cut.startswith("a" * 10) and cut.endswith("b" * 10)
    assert "[... 80 characters cut from the middle of the output ...]" in cut
    captured = mod.Captured(100)
    for i in range(20_000):
        captured.add(f"{i}\n")
    rendered = captured.render()
    total = sum(len(f"{i}\n") for i in range(20_000))
    assert rendered.startswith("0\n1\n2\n") and rendered.endswith("19999\n")
    assert f"[... {total - 100} characters cut" in rendered
    assert len(captured.tail) < 100 + 2 * 16_384 + 200  # memory stays bounded


def test_ping_and_unknown_op(executor: Executor) -> None:
    assert executor.call("ping")["ok"] is True
    bad = executor.call("launch_missiles")
    assert bad["ok"] is False and bad["code"] == "bad_request"


def test_no_output_timeout_then_input_then_ctrl_c(executor: Executor) -> None:
    quiet = executor.call(
        "bash",
        command="echo asking; read answer; echo got $answer",
        no_output_timeout_s=0.5,
        timeout_s=10,
    )
    assert quiet["running"] is True and quiet["exit_code"] == -1
    assert quiet["output"] == "asking\n"
    blocked = executor.call("bash", command="echo other")
    assert blocked["running"] is True and "NOT run" in blocked["note"]
    answered = executor.call("bash", command="yes", is_input=True, timeout_s=5)
    assert answered["running"] is False
    assert (answered["output"], answered["exit_code"]) == ("got yes\n", 0)

    started = time.monotonic()
    long = executor.call("bash", command="sleep 30", no_output_timeout_s=0.3, timeout_s=60)
    assert long["running"] is True
    stopped = executor.call("bash", command="C-c", is_input=True, timeout_s=5)
    assert stopped["running"] is False and stopped["exit_code"] == 130
    assert time.monotonic() - started < 5
    assert executor.call("bash", command="echo fine")["output"] == "fine\n"


def test_input_without_a_running_command_is_refused(executor: Executor) -> None:
    answer = executor.call("bash", command="hello", is_input=True)
    assert "no command is running" in answer["note"]


def test_exit_restarts_the_shell(executor: Executor, tmp_path: Path) -> None:
    executor.call("bash", command="cd / && sleep 100 &")
    gone = executor.call("bash", command="exit 3", timeout_s=10)
    assert gone["exit_code"] == 3 and "new shell" in gone["note"]
    assert executor.call("bash", command="pwd")["output"].strip() == str(tmp_path)


def test_python_cell_that_kills_its_process_loses_variables(executor: Executor) -> None:
    executor.call("python", code="x = 1")
    died = executor.call("python", code="import os; os._exit(5)")
    assert died["exit_code"] == 5 and "variables were lost" in died["note"]
    again = executor.call("python", code="'x' in globals()")
    assert again["output"].strip() == "False"


def test_editor_commands(executor: Executor, tmp_path: Path) -> None:
    created = executor.call("edit", command="create", path="m.py", file_text="a = 1\nb = 2\n")
    assert created["ok"] and "+a = 1" in created["diff"]
    assert executor.call("edit", command="create", path="m.py", file_text="")["code"] == (
        "file_exists"
    )
    replaced = executor.call(
        "edit", command="str_replace", path="m.py", old_str="b = 2", new_str="b = 3"
    )
    assert "-b = 2" in replaced["diff"] and "+b = 3" in replaced["diff"]
    none = executor.call("edit", command="str_replace", path="m.py", old_str="zzz", new_str="")
    assert none["code"] == "no_match"
    (tmp_path / "dup.txt").write_text("x\nx\n")
    many = executor.call("edit", command="str_replace", path="dup.txt", old_str="x", new_str="y")
    assert many["code"] == "multiple_matches" and "lines 1, 2" in many["error"]
    inserted = executor.call(
        "edit", command="insert", path="m.py", insert_line=1, new_str="import os"
    )
    assert (tmp_path / "m.py").read_text() == "a = 1\nimport os\nb = 3\n"
    assert "+import os" in inserted["diff"]
    view = executor.call("edit", command="view", path="m.py", view_range=[2, 3])
    assert view["content"] == "     2\timport os\n     3\tb = 3"
    executor.call("edit", command="undo", path="m.py")
    executor.call("edit", command="undo", path="m.py")
    assert (tmp_path / "m.py").read_text() == "a = 1\nb = 2\n"
    executor.call("edit", command="undo", path="m.py")
    assert not (tmp_path / "m.py").exists()
    assert executor.call("edit", command="undo", path="m.py")["code"] == "nothing_to_undo"


def fetch_kept(executor: Executor, name: str, size: int | None = None) -> str:
    parts, offset = [], 0
    while True:
        piece = executor.call(
            "chunk", name=name, offset=offset, drop=True, **({"size": size} if size else {})
        )
        assert piece["ok"] is True, piece
        parts.append(piece["data"])
        offset = piece["next"]
        if piece["eof"]:
            return "".join(parts)


def test_long_output_is_cut_and_kept_whole(executor: Executor, tmp_path: Path) -> None:
    whole = "".join(f"{i} é€😀\n" for i in range(1, 50_001))
    answer = executor.call(
        "bash",
        command='for i in $(seq 1 50000); do echo "$i é€😀"; done',
        limit=1000,
        keep=4 << 20,
        timeout_s=60,
    )
    assert answer["exit_code"] == 0 and "characters cut from the middle" in answer["output"]
    assert answer["kept"] == "bash.out"
    assert answer["kept_bytes"] == len(whole.encode())
    # Small pieces end on character boundaries; joined they are the output, end marker excluded.
    assert fetch_kept(executor, "bash.out", size=1001) == whole
    assert not (tmp_path / ".state" / "kept" / "bash.out").exists()  # dropped at the end
    gone = executor.call("chunk", name="bash.out", offset=0)
    assert gone["ok"] is False and gone["code"] == "not_found"

    short = executor.call("bash", command="echo short", limit=1000, keep=4 << 20)
    assert short["output"] == "short\n" and "kept" not in short
    too_long = executor.call("bash", command="seq 1 100000", limit=1000, keep=10_000)
    assert "kept" not in too_long and "characters cut" in too_long["output"]

    cell = executor.call("python", code="print('x' * 5000)", limit=100, keep=1 << 20)
    assert fetch_kept(executor, cell["kept"]) == "x" * 5000 + "\n"
    (tmp_path / "big.txt").write_text("line\n" * 3000)
    read = executor.call("read", path=str(tmp_path / "big.txt"), limit=100, keep=1 << 20)
    assert read["kept"] == "read.out"
    assert fetch_kept(executor, "read.out") == "line\n" * 3000
    escape = executor.call("chunk", name="../../etc/passwd", offset=0)
    assert escape["ok"] is False and escape["code"] == "bad_request"


def test_file_operations_refuse_what_is_not_a_regular_file(
    executor: Executor, tmp_path: Path
) -> None:
    """A FIFO would block a read for ever and /dev/zero never ends: both are refused at once,
    with the kind named, and the files part of the executor keeps working."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    started = time.monotonic()
    for op, fields in (
        ("read", {"path": str(fifo)}),
        ("write", {"path": str(fifo), "content": "x"}),
        ("edit", {"command": "view", "path": str(fifo)}),
        ("read", {"path": "/dev/zero"}),
        ("write", {"path": "/dev/null", "content": "x"}),
    ):
        answer = executor.call(op, **fields)
        assert answer["ok"] is False and answer["code"] == "not_a_regular_file", answer
    assert time.monotonic() - started < 5
    assert "FIFO" in executor.call("read", path=str(fifo))["error"]
    assert "character device" in executor.call("read", path="/dev/zero")["error"]

    huge = tmp_path / "huge.log"
    with open(huge, "wb") as f:
        f.truncate(40 << 20)  # sparse: 40 MiB on paper, nothing on disk
    too_large = executor.call("read", path=str(huge))
    assert too_large["code"] == "file_too_large" and "head, tail" in too_large["error"]
    assert executor.call("write", path=str(tmp_path / "ok.txt"), content="fine\n")["ok"]
    assert executor.call("read", path=str(tmp_path / "ok.txt"))["content"] == "fine\n"
    assert executor.call("write", path=str(tmp_path), content="x")["code"] == "is_a_directory"


def test_a_write_says_what_it_replaced_and_when_it_changed_nothing(
    executor: Executor, tmp_path: Path
) -> None:
    path = str(tmp_path / "shapes.py")
    new = executor.call("write", path=path, content="def area(s):\n")
    assert new["ok"] and "previous_size" not in new and "unchanged" not in new, new
    same = executor.call("write", path=path, content="def area(s):\n")
    assert same["previous_size"] == 13 and same["unchanged"] is True, same
    other = executor.call("write", path=path, content="x = 1\n")
    assert other["previous_size"] == 13 and other["unchanged"] is False, other
    assert Path(path).read_text() == "x = 1\n"


def test_every_operation_of_the_contract_is_served(executor: Executor) -> None:
    for op in OPERATIONS:
        answer = executor.call(op)  # no fields: answered or refused, never an unknown op
        assert "unknown op" not in answer.get("error", ""), answer


def test_every_refusal_code_is_one_of_the_contract() -> None:
    """mypy checks Fail's code against ErrorCode; this checks the sources as they are."""
    codes = set()
    for path in EXECUTOR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("Fail", "_error")
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                codes.add(node.args[0].value)
    assert len(codes) > 10  # the scan found them
    assert codes <= set(typing.get_args(ErrorCode)), codes - set(typing.get_args(ErrorCode))


def test_user_cells_see_the_path_a_script_would_have(executor: Executor) -> None:
    """The Python process runs kernel.py from the package; a cell sees what it saw when the
    executor was one file run as the script: its directory first, not the current one."""
    cell = executor.call(
        "python", code="import sys\nprint(sys.path[0], '' in sys.path, sys.argv, __builtins__)"
    )
    assert cell["output"] == f"{SANDBOX} False [''] <module 'builtins' (built-in)>\n"


def test_the_boot_path_imports_only_built_in_modules() -> None:
    """Every new sandbox waits for what the executor imports before its first ping: the
    package's boot modules, the contract's version, and what `os` and `time` need."""

    def loaded(code: str) -> set[str]:
        probe = f"import sys; before = set(sys.modules); {code}; print(*set(sys.modules) - before)"
        result = subprocess.run(
            [sys.executable, "-S", "-c", probe], capture_output=True, text=True, check=True
        )
        return set(result.stdout.split())

    builtins = loaded("import __future__, _thread, os, time")
    boot = loaded(START.replace("import sys; ", "") + "import executor.dispatcher")
    assert boot - builtins == {
        "executor",
        "executor.config",
        "executor.dispatcher",
        "shared",
        "shared.sandbox_protocol",
    }


def test_an_edit_that_finds_nothing_shows_the_lines_it_most_likely_meant(
    executor: Executor, tmp_path: Path
) -> None:
    """A small model sent `def add(a,b):` for `def add(a, b):` again and again; the error
    now shows it the lines it meant."""
    path = tmp_path / "calc.py"
    path.write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")

    def error(old_str: str) -> str:
        answer = executor.call(
            "edit", command="str_replace", path=str(path), old_str=old_str, new_str="x"
        )
        assert answer["ok"] is False and answer["code"] == "no_match", answer
        return str(answer["error"])

    assert error("def add(a,b):\n return a-b").endswith(
        "nothing was changed. The file has it with other spacing at lines 1-2:\n"
        "def add(a, b):\n    return a - b\n"
        "Copy old_str exactly from the file, with its spaces and indentation."
    )
    assert "most similar text in the file is at line 2:\n    return a - b\n" in error(
        "    return a + b"
    )
    assert error("import sys").endswith("nothing was changed")  # nothing close: no guess
    twice = error("a,b):")  # in two places once spaces are ignored: not applied
    assert "other spacing at line 1:\ndef add(a, b):\n" in twice
    assert path.read_text().count("\n") == 6  # untouched


def test_a_one_line_edit_off_only_in_spaces_is_made_where_it_fits_once(
    executor: Executor, tmp_path: Path
) -> None:
    """The 1.5B model sent `-b` for `return a - b` five times until it was stopped."""
    path = tmp_path / "calc.py"
    path.write_text("def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n")
    answer = executor.call(
        "edit", command="str_replace", path=str(path), old_str="-b", new_str="+b"
    )
    assert answer["ok"] is True, answer
    assert "line 2 is, once spaces are ignored" in answer["content"]
    assert "-    return a - b\n+    return a +b" in answer["diff"]
    indented = executor.call(
        "edit",
        command="str_replace",
        path=str(path),
        old_str="    return a*b",  # its indentation is not added twice
        new_str="    return a ** b",
    )
    assert indented["ok"] is True, indented
    assert path.read_text().endswith("def mul(a, b):\n    return a ** b\n")
