"""The evaluation's checks (tools.eval, issues 16 and 29) are sound: each one fails on the task's
starting files, fails on the task's cheat (the expected result printed or written without the
work) and passes once its reference solution ran, in a fresh container of the sandbox image as
the scorer runs it (uid 1000, no network). The set has two halves of at least 20 tasks, every
kind in both."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.eval.repos import _make_repo
from tools.eval.scorer import Scorer, build_archive
from tools.eval.tasks import HEADLINE, KINDS, SPLITS, TASKS, EvalTask, select

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def scorer() -> Iterator[Scorer]:
    done = subprocess.run(
        ["docker", "image", "inspect", "deckhands/sandbox:latest"], capture_output=True, timeout=60
    )
    if done.returncode != 0:
        pytest.skip("no sandbox image (make image)")
    scorer = Scorer(timeout_s=60, parallel=2)
    yield scorer
    scorer.close()


def _workspace(tmp: Path, task: EvalTask, extra: dict[str, str] | None = None) -> bytes:
    """The task's starting files as the download gives them (entries under workspace/),
    committed in a repository as the runtime checks it out, plus the `extra` files."""
    if task.files:
        _make_repo(tmp, task)
    root = tmp / task.id
    root.mkdir(exist_ok=True)
    for rel, content in (extra or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(root, arcname="workspace")
    return out.getvalue()


def test_the_set_has_two_halves_of_twenty_tasks_and_the_old_headline() -> None:
    assert len(TASKS) >= 40
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert {t.split for t in TASKS} == set(SPLITS)
    for split in SPLITS:
        half = select(split)
        assert len(half) >= 20 and all(t.split == split for t in half), split
        # every kind in each half, none of them more than twice as often in one as in the other
        kinds = Counter(t.kind for t in half)
        assert set(kinds) == set(KINDS), (split, kinds)
    dev, heldout = (Counter(t.kind for t in select(s)) for s in SPLITS)
    assert all(max(dev[k], heldout[k]) <= 2 * min(dev[k], heldout[k]) for k in KINDS)
    assert len(select("all")) == len(TASKS) == len(select("dev")) + len(select("heldout"))
    assert HEADLINE == (
        "squares", "fib", "fix-calc", "unittest-slugify", "three-lines",
        "edit-port", "count-log-lines", "csv-total", "rename-function", "json-names",
    )  # fmt: skip
    assert [t.id for t in select("headline")] == list(HEADLINE)
    assert all(t.split == "dev" for t in select("headline"))
    assert all(t.cheat or t.cheat_files for t in TASKS)
    with pytest.raises(ValueError, match="nope"):
        select("all", ["nope"])
    with pytest.raises(ValueError, match="heldout"):
        select("most")


# A phase: the files (under /check/.phases/<phase>/, written into the workspace), then the
# command, then the check with the phase's final message. The workspace starts again from the
# task's starting files before each.
_PHASE = """reset
cp /check/.phases/{phase}.txt /check/final_message.txt
if [ -d /check/.phases/{phase} ]; then cp -r /check/.phases/{phase}/. . ; fi
( {command} ) >/tmp/eval-{phase}.out 2>&1
"""


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_check_fails_on_the_start_and_the_cheat_and_passes_on_the_solution(
    task: EvalTask, scorer: Scorer, tmp_path: Path
) -> None:
    phases = {
        "start": ({}, ":", task.answer),
        "cheat": (task.cheat_files, task.cheat or ":", task.cheat_answer or task.answer),
        "solution": (task.solution_files, task.solution or ":", task.answer),
    }
    what = {"start": "the starting files", "cheat": "the cheat"}
    hidden = dict(task.check_files)
    script = "cp -a . /tmp/eval-start\n"
    script += "reset() { find . -mindepth 1 -delete && cp -a /tmp/eval-start/. . ; }\n"
    for phase, (files, command, message) in phases.items():
        hidden[f".phases/{phase}.txt"] = message
        hidden |= {f".phases/{phase}/{rel}": content for rel, content in files.items()}
        script += _PHASE.format(phase=phase, command=command)
        if phase == "solution":
            script += (
                "[ $? = 0 ] || { echo 'the solution failed'; cat /tmp/eval-solution.out; exit 1; }"
                f"\nif ! ( {task.check} ); then echo 'the check failed on the solution'; exit 1; "
                "fi\n"
            )
        else:
            script += (
                f"if ( {task.check} ) >/tmp/eval-check.out 2>&1; then "
                f"echo 'the check passed on {what[phase]}'; cat /tmp/eval-{phase}.out "
                "/tmp/eval-check.out; exit 1; fi\n"
            )
    combined = dataclasses.replace(task, check=script, check_files=hidden)
    result = scorer.check(combined, _workspace(tmp_path, task), task.answer)
    assert result.passed, result.output


def test_the_final_message_decides_where_the_task_asks_for_an_answer(
    scorer: Scorer, tmp_path: Path
) -> None:
    task = next(t for t in TASKS if t.id == "three-lines")
    solved = _workspace(tmp_path, task, {"notes.txt": "alpha\nbeta\ngamma\n"})
    assert scorer.check(task, solved, "It has 3 lines.").passed
    assert not scorer.check(task, solved, "It has two lines.").passed


def test_a_workspace_entry_outside_workspace_is_left_out() -> None:
    task = next(t for t in TASKS if t.id == "squares")
    src = io.BytesIO()
    with tarfile.open(fileobj=src, mode="w:gz") as tar:
        for name in ("workspace/ok.txt", "check/final_message.txt", "etc/x", "workspace/../y"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"hi"))
    with tarfile.open(fileobj=io.BytesIO(build_archive(task, src.getvalue(), "msg"))) as tar:
        names = tar.getnames()
        assert "workspace/ok.txt" in names and "etc/x" not in names and "y" not in names
        final = tar.extractfile("check/final_message.txt")
        assert final is not None and final.read() == b"msg"
        assert all(m.uid == 1000 for m in tar.getmembers())


def test_a_missing_sandbox_image_is_one_clear_line() -> None:
    with pytest.raises(
        RuntimeError, match=r"deckhands/no-such-image:x is missing: run `make image`"
    ):
        Scorer("deckhands/no-such-image:x")
