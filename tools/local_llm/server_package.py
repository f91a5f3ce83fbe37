"""llama-cpp-python: built once per machine as a cached wheel, installed into this venv.

Only the package itself is installed from the wheel (--no-deps); of its requirements (and its
`server` extra's), only those this environment lacks are installed, so the project's own pinned
packages (fastapi, starlette, pydantic...) are never up- or downgraded by it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import sys_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import Version

from .config import LLAMA_CPP_VERSION, LocalLLMConfig
from .model import LocalLLMError

__all__ = ["ensure_llama_cpp", "llama_cpp_installed", "missing_requirements"]

Say = Callable[[str], None]

_DIST = "llama-cpp-python"
_WHEEL_PREFIX = f"llama_cpp_python-{LLAMA_CPP_VERSION}-"


def llama_cpp_installed(python: str = sys.executable) -> bool:
    """The right version is installed in `python`'s environment and its server imports."""
    probe = (
        "import llama_cpp, llama_cpp.server.app as a; "
        f"raise SystemExit(0 if llama_cpp.__version__ == {LLAMA_CPP_VERSION!r} else 3)"
    )
    done = subprocess.run([python, "-c", probe], capture_output=True, check=False)
    return done.returncode == 0


def _wheel_dir(config: LocalLLMConfig) -> Path:
    # One folder per set of build flags: changing DECKHANDS_LOCAL_LLM_CMAKE_ARGS rebuilds.
    flags = hashlib.sha256(config.cmake_args.encode()).hexdigest()[:12]
    return config.wheel_dir / f"llama-cpp-python-{LLAMA_CPP_VERSION}-{flags}"


def _cached_wheel(config: LocalLLMConfig) -> Path | None:
    """A cached wheel this interpreter can install (the package loads its library with ctypes,
    so the wheel is py3-none-<platform>)."""
    supported = set(sys_tags())
    for wheel in sorted(_wheel_dir(config).glob(f"{_WHEEL_PREFIX}*.whl")):
        try:
            tags = parse_wheel_filename(wheel.name)[3]
        except InvalidWheelFilename:
            continue
        if supported & tags:
            return wheel
    return None


def _build_wheel(config: LocalLLMConfig, say: Say) -> Path:
    config.log_dir.mkdir(parents=True, exist_ok=True)
    log = config.log_dir / f"llama-cpp-python-{LLAMA_CPP_VERSION}-build.log"
    staging = config.cache_dir / "wheels.building"
    shutil.rmtree(staging, ignore_errors=True)
    say(
        f"building llama-cpp-python {LLAMA_CPP_VERSION} from source (about 7 minutes on 2 cores;"
        f" log: {log})"
    )
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir",
           "-w", str(staging), f"{_DIST}=={LLAMA_CPP_VERSION}", "-v"]  # fmt: skip
    env = {**os.environ, "CMAKE_ARGS": config.cmake_args}
    with log.open("w") as out:
        out.write(f"CMAKE_ARGS={config.cmake_args}\n$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    built = sorted(staging.glob(f"{_WHEEL_PREFIX}*.whl"))
    if done.returncode != 0 or not built:
        tail = log.read_text(errors="replace")[-3000:]
        raise LocalLLMError(f"building llama-cpp-python failed (see {log}):\n{tail}")
    target_dir = _wheel_dir(config)
    target_dir.mkdir(parents=True, exist_ok=True)
    (target_dir / "CMAKE_ARGS").write_text(config.cmake_args + "\n")
    wheel = target_dir / built[0].name
    built[0].replace(wheel)
    shutil.rmtree(staging, ignore_errors=True)
    say(f"built {wheel.name} in {time.monotonic() - started:.0f}s")
    return wheel


def _wheel_requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    requirements = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            try:
                requirements.append(Requirement(line.split(":", 1)[1].strip()))
            except InvalidRequirement:
                continue
    return requirements


def missing_requirements(requirements: list[Requirement], extra: str = "server") -> list[str]:
    """The base and `extra` requirements that no installed package provides. One installed in
    a version the requirement does not allow is left alone (and `pip check` reports it)."""
    missing = []
    for req in requirements:
        if req.marker is not None:
            env = {**default_environment(), "extra": extra}
            if not req.marker.evaluate(env):  # type: ignore[arg-type]
                continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
            continue
        if req.specifier and not req.specifier.contains(Version(version), prereleases=True):
            pass  # present in another version: the project's pin wins; `pip check` tells
    return missing


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False
    )


def ensure_llama_cpp(config: LocalLLMConfig, say: Say = print) -> Path:
    """Install llama-cpp-python[server] into this interpreter's environment; the cached wheel."""
    wheel = _cached_wheel(config)
    if llama_cpp_installed():
        say(f"llama-cpp-python {LLAMA_CPP_VERSION}: installed")
        return wheel or _wheel_dir(config)
    if wheel is None:
        wheel = _build_wheel(config, say)
    else:
        say(f"llama-cpp-python: cached wheel {wheel}")
    needed = missing_requirements(_wheel_requirements(wheel))
    if needed:
        say(f"installing what llama-cpp-python[server] needs and this venv lacks: {needed}")
        done = _pip("install", "--quiet", *needed)
        if done.returncode != 0:
            raise LocalLLMError(f"installing {needed} failed:\n{done.stderr[-2000:]}")
    done = _pip("install", "--quiet", "--no-deps", "--force-reinstall", str(wheel))
    if done.returncode != 0:
        raise LocalLLMError(f"installing {wheel.name} failed:\n{done.stderr[-2000:]}")
    if not llama_cpp_installed():
        raise LocalLLMError(
            f"llama-cpp-python was installed from {wheel} but `import llama_cpp.server` fails; "
            f"delete the wheel to rebuild it"
        )
    check = _pip("check")
    if check.returncode != 0:
        say(f"warning: pip check reports:\n{check.stdout.strip()}")
    say(f"llama-cpp-python {LLAMA_CPP_VERSION}: installed from {wheel.name}")
    return wheel
