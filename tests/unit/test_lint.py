"""ruff (lint and format) and mypy pass on the whole project (the venv's own binaries)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
MYPY_TARGETS = ["shared", "services", "tools", "deploy/sandbox"]


def _run(tool: str, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    binary = BIN / tool
    if not binary.exists():
        pytest.fail(f"{binary} is missing: install the dev extra (pip install -e '.[dev]')")
    return subprocess.run(
        [str(binary), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_ruff() -> None:
    result = _run("ruff", "check", "--no-cache", ".")
    if result.returncode != 0:
        pytest.fail(f"ruff check . failed:\n{result.stdout}{result.stderr}", pytrace=False)


def test_ruff_format() -> None:
    result = _run("ruff", "format", "--check", "--no-cache", ".")
    if result.returncode != 0:
        pytest.fail(
            f"ruff format --check . failed (run `ruff format .`):\n{result.stdout}{result.stderr}",
            pytrace=False,
        )


def test_mypy() -> None:
    # Only the packages that exist: a service folder may still be empty while it is written.
    targets = [t for t in MYPY_TARGETS if (ROOT / t).is_dir()]
    result = _run("mypy", *targets)
    if result.returncode != 0:
        command = " ".join(["mypy", *targets])
        pytest.fail(f"{command} failed:\n{result.stdout}{result.stderr}", pytrace=False)
