"""The first rule set, one case per rule and the ones it must let through."""

from __future__ import annotations

import pytest

from services.security.rules import review
from shared.events import (
    CmdRunAction,
    FileReadAction,
    FileWriteAction,
    RiskLevel,
    RunPythonAction,
    Verdict,
)


def _cmd(command: str) -> CmdRunAction:
    return CmdRunAction(task_id="t", source="AGENT", command=command)


@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("rm -rf /", "delete_root"),
        ("rm -rf /*", "delete_root"),
        ("sudo rm -fr / ", "delete_root"),
        ("cd /tmp && rm -r -f ~", "delete_root"),
        ("rm -rf --no-preserve-root /", "delete_root"),
        (":(){ :|:& };:", "fork_bomb"),
        ("bomb(){ bomb|bomb& };bomb", "fork_bomb"),
        ("mkfs.ext4 /dev/sda1", "disk_wipe"),
        ("dd if=/dev/zero of=/dev/sda bs=1M", "disk_wipe"),
        ("sudo reboot", "power"),
        ("chmod -R 777 /", "chmod_root"),
    ],
)
def test_dangerous_commands_are_denied(command: str, rule: str) -> None:
    finding = review(_cmd(command))
    assert finding.verdict is Verdict.DENY
    assert finding.rule == rule
    assert finding.risk is RiskLevel.HIGH


@pytest.mark.parametrize(
    ("command", "risk"),
    [
        ("python3 squares.py", RiskLevel.LOW),
        ("rm -rf build/", RiskLevel.LOW),
        ("rm -rf ./tmp/*", RiskLevel.LOW),
        ("ls /", RiskLevel.LOW),
        ("pip install requests", RiskLevel.MEDIUM),
        ("curl https://example.com", RiskLevel.MEDIUM),
    ],
)
def test_ordinary_commands_are_allowed_with_a_risk(command: str, risk: RiskLevel) -> None:
    finding = review(_cmd(command))
    assert finding.verdict is Verdict.ALLOW
    assert finding.risk is risk


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("squares.py", True),
        ("/workspace/src/a.py", True),
        ("/etc/passwd", False),
        ("../outside.txt", False),
        ("/workspace/../etc/shadow", False),
        ("/workspacex/file", False),
    ],
)
def test_writes_must_stay_in_the_workspace(path: str, allowed: bool) -> None:
    finding = review(FileWriteAction(task_id="t", source="AGENT", path=path, content="x"))
    assert (finding.verdict is Verdict.ALLOW) is allowed
    if not allowed:
        assert finding.rule == "write_outside_workspace"


def test_python_deleting_root_is_denied_and_shelling_out_is_medium() -> None:
    deny = review(
        RunPythonAction(task_id="t", source="AGENT", code="import shutil\nshutil.rmtree('/')")
    )
    assert deny.verdict is Verdict.DENY
    medium = review(RunPythonAction(task_id="t", source="AGENT", code="import os\nos.system('ls')"))
    assert (medium.verdict, medium.risk) == (Verdict.ALLOW, RiskLevel.MEDIUM)


def test_reads_are_low_risk() -> None:
    finding = review(FileReadAction(task_id="t", source="AGENT", path="/etc/hostname"))
    assert (finding.verdict, finding.risk) == (Verdict.ALLOW, RiskLevel.LOW)


def test_edits_outside_the_workspace_are_denied_but_views_are_reads() -> None:
    from shared.events import FileEditAction

    def edit(command: str, path: str) -> Verdict:
        action = FileEditAction(
            task_id="t", source="AGENT", command=command, path=path, file_text="x"
        )
        return review(action).verdict

    assert edit("create", "notes.md") is Verdict.ALLOW
    assert edit("str_replace", "/etc/hosts") is Verdict.DENY
    assert edit("view", "/etc/hosts") is Verdict.ALLOW
