"""The `deckhands` command (its installed entry point, as a user runs it) against the whole
stack on the scripted LLM (tests/console/conftest.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from tools.stack import Stack

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]

DECKHANDS = Path(sys.executable).with_name("deckhands")
SEED = "Write a Python script that prints the squares of 1 to 10 and run it"


def _env(stack: Stack) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECKHANDS_")}
    env |= {"DECKHANDS_URL": stack.config.gateway_url, "DECKHANDS_API_KEY": stack.api_key}
    env["XDG_CONFIG_HOME"] = "/nonexistent"  # no user config file gets in the way
    env["COLUMNS"] = "120"
    return env


def deckhands(
    stack: Stack, *args: str, input: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DECKHANDS), *args],
        env=_env(stack),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def _task_id(output: str) -> str:
    found = re.search(r"task ([0-9a-f]{32}) accepted", output)
    assert found, output
    return found.group(1)


def _show(stack: Stack, task_id: str) -> dict[str, Any]:
    shown = deckhands(stack, "show", task_id, "--json")
    assert shown.returncode == 0, shown.stderr
    result: dict[str, Any] = json.loads(shown.stdout)
    return result


def _wait_state(stack: Stack, task_id: str, *states: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        task = _show(stack, task_id)
        if task["state"] in states or time.monotonic() > deadline:
            assert task["state"] in states, task
            return task
        time.sleep(0.3)


def test_run_follows_the_seed_task_and_exits_by_its_state(console_stack: Stack) -> None:
    done = deckhands(console_stack, "run", SEED, "--label", "team=cli", "--label", "seed")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    task_id = _task_id(out)
    # The command and its output, as a terminal shows them; the edit as a diff; the result.
    assert "$ python3 squares.py" in out and "10 squared is 100" in out
    assert "+++ squares.py" in out and "+# The squares of 1 to 10." in out
    assert "A loop over 1..10" in out  # the agent's thought
    assert "RUNNING -> FINISHED" in out and "5/30 iterations" in out
    assert out.count("It printed:") == 1  # the result is not printed twice

    listed = deckhands(console_stack, "tasks", "--label", "team=cli", "--json")
    assert listed.returncode == 0, listed.stderr
    tasks = json.loads(listed.stdout)
    assert [t["id"] for t in tasks] == [task_id]
    assert tasks[0]["state"] == "FINISHED" and tasks[0]["cost_usd"] > 0
    table = deckhands(console_stack, "tasks", "--label", "team=cli")
    assert task_id in table.stdout and "FINISHED" in table.stdout and "team=cli" in table.stdout
    none = deckhands(console_stack, "tasks", "--label", "team=cli", "--active")
    assert none.returncode == 0 and "no task matches" in none.stdout

    # The log again, as JSON lines: every event once, in order.
    logged = deckhands(console_stack, "logs", task_id, "--json")
    seqs = [json.loads(line)["seq"] for line in logged.stdout.splitlines()]
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 15
    followed = deckhands(console_stack, "logs", "-f", task_id, "--after", "10")
    assert followed.returncode == 0 and "#11" in followed.stdout and "#10 " not in followed.stdout

    trajectory = Path(console_stack.config.run_dir) / "cli-trajectory.json"
    saved = deckhands(console_stack, "trajectory", task_id, "-o", str(trajectory))
    assert saved.returncode == 0 and json.loads(trajectory.read_text())["task_id"] == task_id


def test_run_asks_for_a_network_policy_and_says_why_it_is_refused(console_stack: Stack) -> None:
    """`--allow`, `--preset` and `--between-actions` make the task's `network`; this stack
    allows no egress (DECKHANDS_EGRESS_ALLOW empty), so the gateway's 422 names the rule."""
    refused = deckhands(console_stack, "run", "-d", "--allow", "203.0.113.7:443", "fetch the page")
    assert refused.returncode == 6, refused.stdout + refused.stderr
    assert "203.0.113.7:443" in refused.stderr and "outside" in refused.stderr, refused.stderr
    alone = deckhands(console_stack, "run", "-d", "--between-actions", "pypi.org", "x")
    assert alone.returncode == 6 and "between_actions needs rules" in alone.stderr, alone.stderr


def test_approve_from_another_shell_while_run_waits(console_stack: Stack) -> None:
    run = subprocess.Popen(
        [str(DECKHANDS), "run", "risky: install requests", "--confirm", "--threshold", "MEDIUM"],
        env=_env(console_stack),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None
        lines = []
        for line in run.stdout:
            lines.append(line)
            if "waiting for your approval" in line:
                break
        out = "".join(lines)
        assert "waiting for your approval" in out, out
        task_id = _task_id(out)
        approved = deckhands(console_stack, "approve", task_id)
        assert approved.returncode == 0, approved.stderr
        assert "approved:" in approved.stdout and "pip install requests" in approved.stdout
        rest, _ = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, out + rest
    assert "USER_CONFIRMED" in rest and "RUNNING -> FINISHED" in rest
    # Nothing waits any more: a second approval is refused, saying why.
    again = deckhands(console_stack, "approve", task_id)
    assert again.returncode == 6 and "no action awaits a confirmation" in again.stderr


def test_interactive_run_asks_for_the_confirmation_itself(console_stack: Stack) -> None:
    rejected = deckhands(
        console_stack,
        "run",
        "risky: install requests",
        "--confirm",
        "--threshold",
        "MEDIUM",
        "--interactive",
        input="n\n",
    )
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert "the agent wants to run:" in rejected.stdout and "approve it?" in rejected.stdout
    assert "rejected by you" in rejected.stdout and "USER_REJECTED" in rejected.stdout


def test_a_question_ends_run_until_say_answers_it(console_stack: Stack) -> None:
    asked = deckhands(console_stack, "run", "ask: greet me")
    assert asked.returncode == 5, asked.stdout + asked.stderr
    assert "Which file should I greet you in?" in asked.stdout
    task_id = _task_id(asked.stdout)
    assert f"deckhands say {task_id}" in asked.stdout
    said = deckhands(console_stack, "say", task_id, "hello from the command line")
    assert said.returncode == 0, said.stderr
    followed = deckhands(console_stack, "logs", "-f", task_id, "--timeout", "90")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "hello from the command line" in followed.stdout
    assert "Wrote your answer to greeting.txt" in followed.stdout


def test_pause_resume_stop_and_the_exit_code_of_a_stopped_task(console_stack: Stack) -> None:
    detached = deckhands(console_stack, "run", "slow squares, please", "--detach")
    assert detached.returncode == 0, detached.stderr
    task_id = detached.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]{32}", task_id), detached.stdout
    _wait_state(console_stack, task_id, "RUNNING")
    assert deckhands(console_stack, "pause", task_id).returncode == 0
    _wait_state(console_stack, task_id, "PAUSED")
    assert deckhands(console_stack, "resume", task_id).returncode == 0
    _wait_state(console_stack, task_id, "RUNNING", "FINISHED")
    stopped = deckhands(console_stack, "stop", task_id)
    assert stopped.returncode == 0, stopped.stderr
    followed = deckhands(console_stack, "logs", "-f", task_id, "--timeout", "60")
    assert followed.returncode in (0, 3), followed.stdout  # it may have finished first
    if followed.returncode == 3:
        assert "STOPPED" in followed.stdout
    states = [
        json.loads(line).get("agent_state")
        for line in deckhands(console_stack, "logs", task_id, "--json").stdout.splitlines()
    ]
    assert "PAUSED" in states


def test_run_gives_up_following_at_the_timeout(console_stack: Stack) -> None:
    started = time.monotonic()
    late = deckhands(console_stack, "run", "slow squares, again", "--timeout", "2")
    assert late.returncode == 124, late.stdout + late.stderr
    assert "after the timeout" in late.stderr
    assert time.monotonic() - started < 30
    task_id = _task_id(late.stdout)
    _wait_state(console_stack, task_id, "FINISHED", timeout_s=60)


def test_errors_are_named_with_their_exit_code(console_stack: Stack) -> None:
    missing = deckhands(console_stack, "show", "0" * 32)
    assert missing.returncode == 6 and "404" in missing.stderr and "not found" in missing.stderr
    env = _env(console_stack) | {"DECKHANDS_API_KEY": "dh_000000000000_" + "x" * 43}
    refused = subprocess.run(
        [str(DECKHANDS), "tasks"], env=env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 6 and "refused the API key" in refused.stderr
    too_many = deckhands(
        console_stack, "run", "x", *[a for i in range(17) for a in ("-l", f"l{i}")]
    )
    assert too_many.returncode == 6 and "labels" in too_many.stderr


def test_logs_follow_survives_a_gateway_restart_and_shows_each_event_once(
    console_stack: Stack,
) -> None:
    detached = deckhands(console_stack, "run", "slow squares, once more", "--detach")
    task_id = detached.stdout.strip()
    follow = subprocess.Popen(
        [str(DECKHANDS), "logs", "-f", task_id, "--json", "--timeout", "120"],
        env=_env(console_stack),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        seen = [json.loads(follow.stdout.readline())["seq"] for _ in range(4)]
        console_stack.kill_service("gateway")
        time.sleep(1)
        console_stack.start_service("gateway")
        console_stack.wait_ready(("gateway",))
        rest, errors = follow.communicate(timeout=120)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()
    assert follow.returncode == 0, errors
    seen += [json.loads(line)["seq"] for line in rest.splitlines()]
    assert seen == list(range(1, len(seen) + 1)) and len(seen) >= 12, seen
    assert "reconnecting after #" in errors


def test_upload_diff_and_download_the_workspace(console_stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "greeting.txt").write_text("old greeting\n")
    (tmp_path / "src" / "README").write_text("keep\n")
    tree = tmp_path / "tree.tar.gz"
    with tarfile.open(tree, "w:gz") as tar:
        for name in ("greeting.txt", "README"):
            tar.add(tmp_path / "src" / name, arcname=name)
    task_id = deckhands(console_stack, "run", "ask: greet me", "--detach").stdout.strip()
    _wait_state(console_stack, task_id, "AWAITING_USER_INPUT")
    uploaded = deckhands(console_stack, "upload", task_id, str(tree))
    assert uploaded.returncode == 0 and "2 file(s) written" in uploaded.stdout, uploaded.stderr
    assert deckhands(console_stack, "say", task_id, "hello, shell").returncode == 0
    assert deckhands(console_stack, "logs", "-f", task_id, "--timeout", "90").returncode == 0

    changes = deckhands(console_stack, "diff", task_id)
    assert changes.returncode == 0, changes.stderr
    assert "-old greeting" in changes.stdout and "+hello, shell" in changes.stdout
    assert changes.stdout.startswith("diff --git")  # piped: the diff as it is

    archive = tmp_path / "out.tar.gz"
    got = deckhands(console_stack, "workspace", task_id, "-o", str(archive))
    assert got.returncode == 0, got.stderr
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "workspace/greeting.txt" in names and "workspace/README" in names
    one = tmp_path / "one.txt"
    got = deckhands(console_stack, "workspace", task_id, "--path", "greeting.txt", "-o", str(one))
    assert got.returncode == 0 and one.read_text() == "hello, shell\n"
    # A task with no repository and no upload has nothing to compare with: said so.
    plain = _task_id(deckhands(console_stack, "run", SEED).stdout)
    nothing = deckhands(console_stack, "diff", plain)
    assert nothing.returncode == 6 and "no repository" in nothing.stderr, nothing.stderr


def test_login_keeps_url_and_key_for_later_commands(console_stack: Stack, tmp_path: Path) -> None:
    env = _env(console_stack)
    del env["DECKHANDS_URL"], env["DECKHANDS_API_KEY"]
    env["XDG_CONFIG_HOME"] = str(tmp_path)
    url = console_stack.config.gateway_url

    def cli(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(DECKHANDS), *args],
            env=env,
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )

    config = tmp_path / "deckhands" / "config.toml"
    for _ in range(2):
        posted = deckhands(console_stack, "run", "-d", "-l", "login-test", "nothing to do")
        assert posted.returncode == 0, posted.stderr
    wrong = cli("login", "--url", url, input="dh_000000000000_" + "x" * 43 + "\n")
    assert wrong.returncode == 6 and "refused the API key" in wrong.stderr
    assert not config.exists()  # nothing kept for a key that does not work
    done = cli("login", "--url", url, input=console_stack.api_key + "\n")
    assert done.returncode == 0, done.stderr
    assert f"as tenant {console_stack.config.tenant}" in done.stdout
    assert console_stack.api_key not in done.stdout  # the key is not echoed
    assert (config.stat().st_mode & 0o777) == 0o600
    listed = cli("tasks", "-l", "login-test", "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 2
    more = cli("tasks", "-l", "login-test", "--limit", "1")
    assert more.stdout.count("nothing to do") == 1 and "(more: --limit 2)" in more.stdout


def test_ctrl_c_leaves_the_task_running(console_stack: Stack) -> None:
    run = subprocess.Popen(
        [str(DECKHANDS), "run", "slow squares, interrupted"],
        env=_env(console_stack),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert run.stdout is not None
        task_id = _task_id(run.stdout.readline())
        assert run.stdout.readline().startswith("#1 ")  # following
        run.send_signal(signal.SIGINT)
        _, errors = run.communicate(timeout=30)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 130, errors
    assert f"deckhands logs -f {task_id}" in errors and "Traceback" not in errors
    _wait_state(console_stack, task_id, "FINISHED", timeout_s=60)


def test_fork_a_finished_task_from_the_command_line(console_stack: Stack) -> None:
    parent = _task_id(deckhands(console_stack, "run", SEED).stdout)
    _wait_state(console_stack, parent, "FINISHED")
    log = [
        json.loads(line)
        for line in deckhands(console_stack, "logs", parent, "--json").stdout.splitlines()
    ]
    wrote = next(e for e in log if e["kind"] in ("write", "run"))
    at = next(e["seq"] for e in log if e.get("cause") == wrote["id"] and e["seq"] > wrote["seq"])

    made = deckhands(console_stack, "fork", parent, "--at", str(at), "-n", "2", "run it again")
    assert made.returncode == 0, made.stderr
    assert f"forked {parent} at seq {at}" in made.stdout
    forks = re.findall(r"^([0-9a-f]{32})$", made.stdout, re.MULTILINE)
    assert len(forks) == 2, made.stdout
    for fork in forks:
        shown = _wait_state(console_stack, fork, "FINISHED")
        assert (shown["forked_from"], shown["forked_at"]) == (parent, at)
    human = deckhands(console_stack, "show", forks[0])
    assert f"forked from  {parent} at seq {at}" in human.stdout, human.stdout
    logs = deckhands(console_stack, "logs", forks[0]).stdout
    assert f"a fork of {parent}" in logs and "↰" in logs and "run it again" in logs
    listed = deckhands(console_stack, "tasks", "--forked-from", parent, "--json")
    assert sorted(t["id"] for t in json.loads(listed.stdout)) == sorted(forks)
    # A seq past the log's end: the gateway's reason, and the refusal's exit code.
    refused = deckhands(console_stack, "fork", parent, "--at", "9999")
    assert refused.returncode == 6 and "ends at seq" in refused.stderr, refused.stderr
