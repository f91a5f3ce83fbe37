"""The V1 tools (issue 29, item 4): glob, grep, apply_patch and task_tracker calls become their
actions, replay as the same calls in the prompt, and a plan is the result its call reads; the
security monitor keeps a patch inside the workspace; the runtime runs a patch atomically and
names the hunk that did not apply (tool_commands.py, with the host's git)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.reasoner.prompt import build_messages
from services.reasoner.tools import ToolCall, action_for_call, call_for_action
from services.runtime.tool_commands import glob_command, grep_command, patch_command
from services.security.rules import review
from shared.events import (
    ApplyPatchAction,
    EventSource,
    GlobAction,
    GrepAction,
    MessageAction,
    TaskTrackerAction,
    Verdict,
)

FIELDS = {"task_id": "t1", "source": EventSource.AGENT, "cause": "step-1"}

PATCH = """--- a/calc.py
+++ b/calc.py
@@ -1,2 +1,2 @@
 def add(a, b):
-    return a - b
+    return a + b
--- a/notes.txt
+++ b/notes.txt
@@ -1 +1 @@
-old
+new
"""


def _call(name: str, **arguments: object) -> object:
    return action_for_call(ToolCall(name, arguments, id="call-1"), {**FIELDS, "tool_call_id": "c1"})


def test_each_tool_call_becomes_its_action_and_replays_as_the_same_call() -> None:
    glob = _call("glob", pattern="**/*.py", path="src")
    grep = _call("grep", pattern="def add", include="*.py")
    patch = _call("apply_patch", patch=PATCH)
    plan = _call(
        "task_tracker",
        command="plan",
        tasks=[{"title": "read calc.py", "status": "done"}, {"title": "fix add"}],
    )
    assert isinstance(glob, GlobAction) and (glob.pattern, glob.path) == ("**/*.py", "src")
    assert isinstance(grep, GrepAction) and grep.include == "*.py" and grep.path == ""
    assert isinstance(patch, ApplyPatchAction) and patch.patch == PATCH
    assert isinstance(plan, TaskTrackerAction) and [t.status for t in plan.tasks] == [
        "done",
        "todo",
    ]
    assert call_for_action(glob) == ("glob", {"pattern": "**/*.py", "path": "src"})
    assert call_for_action(grep) == ("grep", {"pattern": "def add", "include": "*.py"})
    assert call_for_action(patch) == ("apply_patch", {"patch": PATCH})
    assert call_for_action(plan) == (
        "task_tracker",
        {
            "command": "plan",
            "tasks": [{"title": "read calc.py", "status": "done"}, {"title": "fix add"}],
        },
    )


def test_a_plan_is_the_result_its_call_reads_and_view_shows_the_last_one() -> None:
    task = MessageAction(task_id="t1", source=EventSource.USER, content="fix it", seq=1)
    plan = _call(
        "task_tracker", command="plan", tasks=[{"title": "fix add", "status": "in_progress"}]
    )
    view = action_for_call(
        ToolCall("task_tracker", {"command": "view"}, id="call-2"),
        {**FIELDS, "tool_call_id": "c2", "id": "view-1"},
    )
    events = [task, plan.model_copy(update={"seq": 2}), view.model_copy(update={"seq": 3})]  # type: ignore[attr-defined]
    results = [m for m in build_messages(events, native=True) if m["role"] == "tool"]
    assert results[0]["content"] == "Plan updated:\n1. [~] fix add"
    assert results[1]["content"] == "The plan:\n1. [~] fix add"


def test_a_patch_may_only_write_inside_the_workspace() -> None:
    inside = ApplyPatchAction(patch=PATCH, **FIELDS)
    assert review(inside).verdict is Verdict.ALLOW
    outside = ApplyPatchAction(patch=PATCH.replace("b/notes.txt", "b/../../etc/passwd"), **FIELDS)
    assert review(outside).verdict is Verdict.DENY
    assert review(GlobAction(pattern="*", **FIELDS)).verdict is Verdict.ALLOW


def _in(tmp: Path, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command.replace("cd /workspace", f"cd {tmp}", 1)],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_a_patch_applies_every_hunk_or_none_and_names_the_one_that_failed(
    tmp_path: Path,
) -> None:
    (tmp_path / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    (tmp_path / "notes.txt").write_text("something else\n")
    failed = _in(tmp_path, patch_command(ApplyPatchAction(patch=PATCH, **FIELDS)))
    assert failed.returncode != 0
    assert "notes.txt" in failed.stderr and "patch does not apply" in failed.stderr
    assert "return a - b" in (tmp_path / "calc.py").read_text()  # nothing written

    (tmp_path / "notes.txt").write_text("old\n")
    applied = _in(tmp_path, patch_command(ApplyPatchAction(patch=PATCH, **FIELDS)))
    assert applied.returncode == 0, applied.stderr
    assert "return a + b" in (tmp_path / "calc.py").read_text()
    assert (tmp_path / "notes.txt").read_text() == "new\n"
    # A patch naming files without a/ and b/ applies too; one holding the heredoc's end
    # marker cannot end it early (the marker is random).
    bare = "--- notes.txt\n+++ notes.txt\n@@ -1 +1 @@\n-new\n+newer DECKHANDS_PATCH_x\n"
    assert _in(tmp_path, patch_command(ApplyPatchAction(patch=bare, **FIELDS))).returncode == 0
    assert (tmp_path / "notes.txt").read_text() == "newer DECKHANDS_PATCH_x\n"


@pytest.mark.parametrize(
    "action",
    [
        GlobAction(pattern="*.py'; touch pwned; '", path="a b", **FIELDS),
        GrepAction(pattern="$(touch pwned)", include="`touch pwned`", **FIELDS),
    ],
)
def test_search_arguments_are_quoted_never_run(
    action: GlobAction | GrepAction, tmp_path: Path
) -> None:
    """Run with a stand-in for ripgrep that prints its arguments: each argument arrives as
    one word, and nothing in it ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rg").write_text('#!/bin/sh\nprintf "<%s>\\n" "$@"\n')
    (bin_dir / "rg").chmod(0o755)
    (tmp_path / "a b").mkdir()
    command = glob_command(action) if isinstance(action, GlobAction) else grep_command(action)
    ran = subprocess.run(
        [
            "bash",
            "-c",
            f"export PATH={bin_dir}:$PATH; " + command.replace("/workspace", str(tmp_path), 1),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert ran.returncode == 0, ran.stderr
    assert not list(tmp_path.rglob("pwned"))
    assert f"<{action.pattern}>" in ran.stdout
