"""Every service refuses a bad configuration the same way (shared/startup.py): one line on
stderr naming the variable and what is wrong, exit code 2, no traceback, and not the value
(it may be a secret). Each service is started as an operator starts it, `python -m`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.subjects import Service

ROOT = Path(__file__).resolve().parents[2]


def _start(service: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DECKHANDS_")}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", f"services.{service}"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("service", [s.value for s in Service])
def test_a_bad_setting_stops_the_service_with_one_line_naming_it(service: str) -> None:
    done = _start(service, DECKHANDS_MAX_DELIVERIES="sekrit-7f3a", DECKHANDS_LLM_MODEL="x/y")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{service}: bad configuration: DECKHANDS_MAX_DELIVERIES: ")
    assert "valid integer" in lines[0]
    assert "sekrit-7f3a" not in done.stderr + done.stdout


def test_a_service_requirement_is_refused_the_same_way() -> None:
    done = _start("reasoner", DECKHANDS_LLM_MODEL="")
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith(
        "reasoner: bad configuration: DECKHANDS_LLM_MODEL is not set"
    )
