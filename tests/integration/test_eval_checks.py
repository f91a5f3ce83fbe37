"""The evaluation's checks (tools.eval, issue 16) are sound: each one fails on the task's
starting files and passes once its reference solution ran, in a fresh container of the sandbox
image as the scorer runs it (uid 1000, no network)."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.eval.repos import _make_repo
from tools.eval.scorer import Scorer, build_archive
from tools.eval.tasks import HEADLINE, TASKS, EvalTask, select

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


def _workspace(tmp: Path, task: EvalTask) -> bytes:
    """The task's starting files as the download gives them (entries under workspace/),
    committed in a repository as the runtime checks it out, plus its solution's files."""
    if task.files:
        _make_repo(tmp, task)
    root = tmp / task.id
    root.mkdir(exist_ok=True)
    for rel, content in task.solution_files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(content)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        tar.add(root, arcname="workspace")
    return out.getvalue()


def test_the_set_has_twenty_tasks_and_a_headline_of_ten() -> None:
    assert len(TASKS) >= 20
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert len(HEADLINE) == 10 and [t.id for t in select("headline")] == list(HEADLINE)
    assert {t.kind for t in TASKS} >= {"script", "bugfix", "tests", "edit", "shell", "multi-file"}
    with pytest.raises(ValueError, match="nope"):
        select("all", ["nope"])


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_check_fails_on_the_start_and_passes_on_the_solution(
    task: EvalTask, scorer: Scorer, tmp_path: Path
) -> None:
    # The solution's files are in the archive, so the start is the workspace before they were
    # written: the check must fail there (files moved aside), then the solution runs.
    names = " ".join(f"'{rel}'" for rel in task.solution_files)
    aside = (
        f'mkdir -p /tmp/aside && for f in {names}; do mv "$f" /tmp/aside/; done; ' if names else ""
    )
    back = "cp -r /tmp/aside/. . ; " if names else ""
    combined = dataclasses.replace(
        task,
        check=f"{aside}if ( {task.check} ) >/tmp/start.out 2>&1; then "
        "echo 'the check passed on the starting files'; cat /tmp/start.out; exit 1; fi\n"
        f"{back}( {task.solution} ) >/tmp/solution.out 2>&1 || {{ echo 'the solution failed';"
        " cat /tmp/solution.out; exit 1; }\n"
        f"{task.check}",
    )
    result = scorer.check(combined, _workspace(tmp_path, task), task.answer)
    assert result.passed, result.output


def test_the_final_message_decides_where_the_task_asks_for_an_answer(
    scorer: Scorer, tmp_path: Path
) -> None:
    task = next(t for t in TASKS if t.id == "three-lines")
    solved = _workspace(
        tmp_path, dataclasses.replace(task, solution_files={"notes.txt": "alpha\nbeta\ngamma\n"})
    )
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
