"""deploy/prometheus: the alert rules are valid (`promtool check rules`) and each alert fires,
and stays quiet, where alerts_test.yml says (`promtool test rules`). promtool comes from
Debian's prometheus package (`make system-packages`)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool not found: `make system-packages` installs Debian's prometheus")
    return subprocess.run(
        [promtool, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60
    )


def test_the_alert_rules_are_valid() -> None:
    checked = _promtool("check", "rules", "alerts.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_each_alert_fires_and_stays_quiet_as_its_unit_tests_say() -> None:
    tested = _promtool("test", "rules", "alerts_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test() -> None:
    rules = (RULES_DIR / "alerts.yml").read_text()
    tests = (RULES_DIR / "alerts_test.yml").read_text()
    alerts = [line.split(":", 1)[1].strip() for line in rules.splitlines() if "- alert:" in line]
    assert alerts
    untested = [a for a in alerts if f"alertname: {a}\n" not in tests]
    assert not untested, f"no promtool test for {untested}"
