"""`deckhands show` and `logs` show the agent's plan (issue 29: the task tracker), and the
entries of the other V1 tools, uploads and loop hints read as what they are."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tools.cli.events import event_renderable
from tools.cli.render import task_view

PLAN = [
    {"title": "find the bug", "status": "done", "notes": ""},
    {"title": "fix it", "status": "in_progress", "notes": "a patch"},
    {"title": "run the tests", "status": "todo", "notes": ""},
]


def _text(renderable: Any) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_show_prints_the_plan() -> None:
    task = {
        "id": "t1",
        "task": "fix add",
        "state": "RUNNING",
        "reason": "",
        "iterations": 3,
        "max_iterations": 30,
        "usage": {},
        "created_at": "2026-11-28T19:00:00Z",
        "plan": PLAN,
    }
    shown = _text(task_view(task))
    assert "plan:" in shown
    assert "1. [x] find the bug\n2. [~] fix it (a patch)\n3. [ ] run the tests" in shown


def test_the_logs_name_each_new_entry() -> None:
    plan = _text(event_renderable({"kind": "task_tracker", "command": "plan", "tasks": PLAN}))
    assert "plans" in plan and "2. [~] fix it (a patch)" in plan
    glob = _text(event_renderable({"kind": "glob", "pattern": "**/*.py", "path": "src"}))
    assert "finds files **/*.py in src" in glob
    grep = _text(event_renderable({"kind": "grep", "pattern": "def add", "include": "*.py"}))
    assert "searches def add in *.py" in grep
    hint = _text(event_renderable({"kind": "loop_hint", "hints_given": 1, "hint": "Stop."}))
    assert "loop hint 1: Stop." in hint
    upload = {"kind": "workspace_uploaded", "path": "docs", "files": 3, "format": "tar"}
    assert "uploaded 3 file(s) into /workspace/docs (tar)" in _text(event_renderable(upload))
