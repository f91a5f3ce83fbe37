"""The evaluation harness (issue 16) on the real stack with the scripted LLM: a conversation that
solves its task passes, one that does not fails, an agent that claims success without doing the
work fails, one that asks a question is stopped and fails; `python -m tools.eval` (what `make
eval` runs) prints the table and writes the JSON report; Ctrl-C stops the tasks it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tools.eval.attempts import setup_prompt
from tools.eval.cli import main
from tools.eval.scripted import conversation, setup_conversation, solving_turns, write_script
from tools.eval.tasks import TASKS, EvalTask
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]


def _task(task_id: str) -> EvalTask:
    return next(t for t in TASKS if t.id == task_id)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("eval"))
    wrong = [  # squares: writes cubes, runs them, says it is done
        {
            "tool": "write_file",
            "arguments": {
                "path": "squares.py",
                "content": "for i in range(1, 11):\n    print(i ** 3)\n",
            },
        },
        {"tool": "execute_bash", "arguments": {"command": "python squares.py"}},
        {"tool": "finish", "arguments": {"message": "squares.py prints the squares."}},
    ]
    claims = [  # three-lines: does nothing and says the work is done, with the right count
        {"tool": "finish", "arguments": {"message": "I created notes.txt; wc -l counts 3."}}
    ]
    # --attempts: squares' forks each reach the same turn; only the second one it answers
    # writes the right script (`{{nth}}`), so pass@1 and pass@3 differ.
    guess = (  # printf turns each \\n into a new line
        "if [ {{nth}} = 2 ]; then printf 'for i in range(1, 11):\\n    print(i * i)\\n' "
        "> squares.py; else echo 'print(0)' > squares.py; fi; python squares.py"
    )
    script = write_script(
        run_dir / "script.json",
        [
            setup_conversation(_task("fix-calc")),
            {
                "match": setup_prompt(_task("squares")),
                "turns": [
                    {"tool": "execute_bash", "arguments": {"command": "ls -la"}},
                    {"tool": "finish", "arguments": {"message": "Ready."}},
                    {"tool": "execute_bash", "arguments": {"command": guess}},
                    {"tool": "finish", "arguments": {"message": "Done."}},
                ],
            },
            conversation(_task("fix-calc"), solving_turns(_task("fix-calc"))),
            conversation(_task("json-names"), solving_turns(_task("json-names"))),
            conversation(_task("squares"), wrong),
            conversation(_task("three-lines"), claims),
            # unique-emails: asks a question; nobody answers in an evaluation
            conversation(_task("unique-emails"), [{"content": "Which file do you mean?"}]),
            # primes: works slowly for ever (the last turn repeats), to be interrupted
            conversation(
                _task("primes"),
                [{"tool": "execute_bash", "arguments": {"command": "sleep 1"}, "delay_s": 1}],
            ),
        ],
    )
    config = StackConfig.isolated(
        run_dir,
        llm_script=script,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            # The tasks' repositories are served on loopback (tools/eval/repos.py).
            "DECKHANDS_REPOSITORY_ALLOWED_HOSTS": '["127.0.0.1"]',
        },
    )
    with running(config) as started:
        yield started


def test_eval_scores_scripted_runs(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "key").write_text(stack.api_key)
    report_path = tmp_path / "report.json"
    report = main(
        [
            "--url",
            stack.config.gateway_url,
            "--api-key-file",
            str(tmp_path / "key"),
            "--tasks",
            "fix-calc,squares,three-lines,json-names,unique-emails",
            "--concurrency",
            "2",
            "--timeout",
            "180",
            "--report",
            str(report_path),
            "--show",
            "failed",
        ]
    )
    by_id = {o.id: o for o in report.outcomes}
    # Solved: the check's own copy of the tests passes on the agent's calc.py.
    assert by_id["fix-calc"].passed, by_id["fix-calc"]
    assert by_id["json-names"].passed, by_id["json-names"]
    # Not solved: the file exists and ran, but prints cubes.
    assert not by_id["squares"].passed and by_id["squares"].state == "FINISHED"
    assert by_id["squares"].check_exit not in (0, None)
    # Claimed without the work: the final message has the right number, notes.txt is missing.
    claim = by_id["three-lines"]
    assert not claim.passed and claim.state == "FINISHED" and "3" in claim.final_message
    assert "notes.txt" in claim.check_output
    # Waiting for a person: stopped, then scored on what is there.
    asks = by_id["unique-emails"]
    assert not asks.passed and asks.state == "STOPPED", asks
    assert asks.error == "stopped: waits for a person (AWAITING_USER_INPUT)"
    assert "Which file do you mean?" in asks.transcript
    for outcome in report.outcomes:
        if outcome is asks:
            continue
        assert outcome.task_id and outcome.steps >= 1 and outcome.tokens > 0
        assert outcome.seconds > 0
    assert report.passed == 2 and report.pass_rate == 0.4

    written = json.loads(report_path.read_text())
    assert written["passed"] == 2 and written["total"] == 5 and written["pass_rate"] == 0.4
    assert {t["id"]: t["passed"] for t in written["tasks"]} == {
        "fix-calc": True,
        "squares": False,
        "three-lines": False,
        "json-names": True,
        "unique-emails": False,
    }
    # What the agent did, legible: the command, its output, the file it wrote as a diff.
    wrong = by_id["squares"].transcript
    assert "python squares.py" in wrong and "1000" in wrong and "+    print(i ** 3)" in wrong
    assert "passed" in by_id["fix-calc"].transcript  # pytest's summary line, as printed
    assert "wc -l counts 3" in claim.transcript
    shown = capsys.readouterr().out
    assert "passed 2 of 5 (40%)" in shown
    for task_id in ("fix-calc", "squares", "three-lines", "json-names", "unique-emails"):
        assert task_id in shown
    # --show failed: the failed tasks' transcripts and checks follow the table, not the others'.
    assert "squares: FAIL" in shown and "three-lines: FAIL" in shown
    assert "fix-calc: pass" not in shown


def test_bad_options_exit_2(stack: Stack) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--url", stack.config.gateway_url, "--tasks", "no-such-task"])
    assert exited.value.code == 2


def test_ctrl_c_stops_the_running_tasks_and_exits_130(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "key").write_text(stack.api_key)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.eval",
            "--url",
            stack.config.gateway_url,
            "--api-key-file",
            str(tmp_path / "key"),
            "--tasks",
            "primes",
            "--report",
            str(tmp_path / "report.json"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with httpx.Client(
            base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
        ) as http:
            running_task = None
            deadline = time.monotonic() + 60
            while running_task is None:
                assert time.monotonic() < deadline, "the eval's task never ran"
                listed = http.get("/v1/tasks", params={"label": "eval:primes"}).json()["tasks"]
                running_task = next((t for t in listed if t["iterations"] >= 1), None)
                time.sleep(0.5)
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            assert proc.returncode == 130, out.decode(errors="replace")
            assert b"interrupted: the running tasks were stopped" in out
            assert not (tmp_path / "report.json").exists()
            deadline = time.monotonic() + 30
            while http.get(f"/v1/tasks/{running_task['id']}").json()["state"] != "STOPPED":
                assert time.monotonic() < deadline, "the interrupted task was not stopped"
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_attempts_fork_one_set_up_per_task_and_report_pass_at_k(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "key").write_text(stack.api_key)
    report_path = tmp_path / "report.json"
    report = main(
        [
            "--url",
            stack.config.gateway_url,
            "--api-key-file",
            str(tmp_path / "key"),
            "--tasks",
            "fix-calc,squares",
            "--attempts",
            "3",
            "--timeout",
            "180",
            "--report",
            str(report_path),
        ]
    )
    assert [(o.id, o.attempt) for o in report.outcomes] == [
        (task, attempt) for task in ("fix-calc", "squares") for attempt in (1, 2, 3)
    ]
    passed = {(o.id, o.attempt): o.passed for o in report.outcomes}
    assert all(passed["fix-calc", a] for a in (1, 2, 3)), report.outcomes
    assert sum(passed["squares", a] for a in (1, 2, 3)) == 1, report.outcomes
    assert report.pass_rate == 4 / 6 and report.pass_at_k == 1.0
    written = json.loads(report_path.read_text())
    assert (written["attempts"], written["pass_at_1"], written["pass_at_k"]) == (3, 0.667, 1.0)
    shown = capsys.readouterr().out
    assert "2 tasks x 3 attempts: pass@1 67%" in shown and "pass@3 100%" in shown

    # One set-up per task (its repository checked out once), three forks of it.
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
    ) as http:
        setups = http.get("/v1/tasks", params={"label": "eval:setup"}).json()["tasks"]
        assert len(setups) == 2, setups
        for setup in setups:
            forks = http.get("/v1/tasks", params={"forked_from": setup["id"]}).json()["tasks"]
            assert len(forks) == 3 and {o.task_id for o in report.outcomes} >= {
                f["id"] for f in forks
            }
