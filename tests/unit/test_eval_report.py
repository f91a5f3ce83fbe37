"""The evaluation's report (tools.eval, issue 29) without a stack: each half of the task set
present in a run gets its own pass rate beside the overall one, the iterations spent on failed
tasks are summed and averaged, the JSON report keeps its older fields, and the table's summary
says both. The subsets select the halves; the scripted LLM's cheats answer every task."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from tools.eval.cli import _parser, print_report
from tools.eval.runner import EvalReport, TaskOutcome
from tools.eval.scripted import cheating_turns, solving_turns
from tools.eval.tasks import HEADLINE, TASKS, select

pytestmark = pytest.mark.timeout(60)


def _report(*outcomes: TaskOutcome, attempts: int = 1) -> EvalReport:
    return EvalReport(
        model="m",
        subset="all",
        concurrency=1,
        started_at="2026-01-01T00:00:00+00:00",
        seconds=12.0,
        attempts=attempts,
        outcomes=list(outcomes),
    )


def _outcome(task: str, split: str, passed: bool, steps: int, attempt: int = 1) -> TaskOutcome:
    return TaskOutcome(
        id=task, kind="script", split=split, passed=passed, steps=steps, attempt=attempt
    )


def test_each_half_has_its_pass_rate_and_failed_tasks_their_iterations(tmp_path: Path) -> None:
    report = _report(
        _outcome("a", "dev", True, 4),
        _outcome("b", "dev", True, 5),
        _outcome("c", "dev", False, 30),
        _outcome("d", "heldout", True, 6),
        _outcome("e", "heldout", False, 12),
        _outcome("f", "heldout", False, 3),
        _outcome("g", "heldout", False, 9),
    )
    assert report.passed == 3 and report.pass_rate == 3 / 7
    assert list(report.splits) == ["dev", "heldout"]
    assert report.splits["dev"].passed == 2 and report.splits["dev"].pass_rate == 2 / 3
    assert report.splits["heldout"].pass_rate == 0.25
    assert report.failed_iterations == 30 + 12 + 3 + 9
    assert report.failed_iterations_mean == 54 / 4

    report.write(tmp_path / "r.json")
    written = json.loads((tmp_path / "r.json").read_text())
    assert written["splits"] == {
        "dev": {"passed": 2, "total": 3, "pass_rate": 0.667, "pass_at_k": 0.667},
        "heldout": {"passed": 1, "total": 4, "pass_rate": 0.25, "pass_at_k": 0.25},
    }
    assert written["failed"] == 4
    assert written["failed_iterations"] == 54 and written["failed_iterations_mean"] == 13.5
    # The fields other code reads are still there.
    assert written["passed"] == 3 and written["total"] == 7 and written["pass_rate"] == 0.429
    assert written["pass_at_1"] == 0.429 and written["attempts"] == 1
    assert {t["split"] for t in written["tasks"]} == {"dev", "heldout"}

    out = io.StringIO()
    print_report(report, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "passed 3 of 7 (43%) in 12s" in text
    assert "development half: passed 2 of 3 (67%)" in text
    assert "held-out half: passed 1 of 4 (25%)" in text
    assert "iterations spent on the 4 failed tasks: 54 (13.5 each)" in text


def test_one_half_or_none_failed_prints_no_split_and_no_iterations() -> None:
    report = _report(_outcome("a", "dev", True, 4), _outcome("b", "dev", True, 7))
    assert report.failed_iterations == 0 and report.failed_iterations_mean == 0.0
    assert report.to_json()["splits"] == {
        "dev": {"passed": 2, "total": 2, "pass_rate": 1.0, "pass_at_k": 1.0}
    }
    out = io.StringIO()
    print_report(report, Console(file=out, width=200, color_system=None))
    assert "half" not in out.getvalue() and "iterations" not in out.getvalue()
    assert _report().to_json()["splits"] == {} and _report().failed_iterations_mean == 0.0


def test_with_attempts_each_half_gives_pass_at_1_and_pass_at_k() -> None:
    report = _report(
        _outcome("a", "dev", False, 30, 1),
        _outcome("a", "dev", True, 5, 2),
        _outcome("d", "heldout", False, 10, 1),
        _outcome("d", "heldout", False, 20, 2),
        attempts=2,
    )
    splits = report.to_json()["splits"]
    assert splits["dev"] == {"passed": 1, "total": 2, "pass_rate": 0.5, "pass_at_k": 1.0}
    assert splits["heldout"] == {"passed": 0, "total": 2, "pass_rate": 0.0, "pass_at_k": 0.0}
    assert report.failed_iterations == 60 and report.failed_iterations_mean == 20.0
    out = io.StringIO()
    print_report(report, Console(file=out, width=200, color_system=None))
    text = out.getvalue()
    assert "held-out half: 1 tasks x 2 attempts: pass@1 0% (0 of 2 attempts), pass@2 0%" in text
    assert "iterations spent on the 3 failed attempts: 60 (20.0 each)" in text


def test_the_subsets_select_the_halves_and_the_unchanged_headline() -> None:
    dev, heldout = select("dev"), select("heldout")
    assert len(TASKS) >= 40 and len(dev) >= 20 and len(heldout) >= 20
    assert {t.split for t in dev} == {"dev"} and {t.split for t in heldout} == {"heldout"}
    assert select("all") == dev + heldout
    assert [t.id for t in select("headline")] == list(HEADLINE) and len(HEADLINE) == 10
    assert _parser().parse_args(["--subset", "heldout"]).subset == "heldout"
    assert _parser().parse_args([]).subset == "headline"
    with pytest.raises(ValueError, match="heldout"):
        select("held-out")


def test_the_scripted_cheats_finish_with_the_answer_without_the_solution() -> None:
    fib = next(t for t in TASKS if t.id == "fib")
    cheat = cheating_turns(fib)
    assert cheat[0]["arguments"] == {"path": "fib.py", "content": "print(6765)\n"}
    assert cheat[-1] == {"tool": "finish", "arguments": {"message": fib.answer}}
    assert cheat != solving_turns(fib)
    count = next(t for t in TASKS if t.id == "count-log-lines")
    assert cheating_turns(count)[-1]["arguments"]["message"] == count.cheat_answer
    assert all(cheating_turns(t)[-1]["tool"] == "finish" for t in TASKS)
    assert _parser().parse_args(["--scripted", "cheats"]).scripted == "cheats"
