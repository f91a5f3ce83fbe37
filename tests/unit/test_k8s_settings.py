"""Every DECKHANDS_* variable the manifests set is one a service's settings read.

The settings classes ignore unknown variables (extra="ignore"), so a misspelt or retired name in
a ConfigMap or a container's env is silently without effect. The names a service reads are
taken from the source of its pydantic-settings classes (services/*/*settings.py and
shared/settings), parsed rather than imported so that a service being rewritten cannot break
this check; a second test keeps the parser honest against the imported classes.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from k8s_manifests import ROOT, TARGETS, containers, name, render, workloads

PREFIXED = "DECKHANDS_"


@dataclass
class SettingsClass:
    bases: list[str]
    fields: set[str] = field(default_factory=set)
    aliases: set[str] = field(default_factory=set)
    env_prefix: str | None = None


def _string(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _aliases(call: ast.Call) -> set[str]:
    """validation_alias / alias of a Field(...): a string, or AliasChoices("A", "B")."""
    names = set()
    for keyword in call.keywords:
        if keyword.arg not in ("alias", "validation_alias"):
            continue
        value = keyword.value
        if isinstance(value, ast.Call):
            names |= {s for s in map(_string, value.args) if s}
        elif (text := _string(value)) is not None:
            names.add(text)
    return names


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def parse_settings_file(path: Path) -> dict[str, SettingsClass]:
    classes = {}
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.ClassDef):
            continue
        parsed = SettingsClass(bases=[_base_name(b) for b in node.bases])
        for statement in node.body:
            if isinstance(statement, ast.Assign) and any(
                getattr(t, "id", None) == "model_config" for t in statement.targets
            ):
                if isinstance(statement.value, ast.Call):
                    for keyword in statement.value.keywords:
                        if keyword.arg == "env_prefix":
                            parsed.env_prefix = _string(keyword.value)
            elif isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
                field_name = statement.target.id
                annotation = ast.unparse(statement.annotation)
                if field_name.startswith("_") or annotation.startswith("ClassVar"):
                    continue
                aliases = (
                    _aliases(statement.value) if isinstance(statement.value, ast.Call) else set()
                )
                # pydantic-settings reads a field by its aliases only, when it has any.
                if aliases:
                    parsed.aliases |= aliases
                else:
                    parsed.fields.add(field_name)
        classes[node.name] = parsed
    return classes


def settings_files() -> list[Path]:
    shared = [ROOT / "shared" / "settings.py", *sorted((ROOT / "shared" / "settings").glob("*.py"))]
    # A service's settings.py, and the parts of its settings kept apart (e.g. the runtime's
    # checkpoint_settings.py).
    return [p for p in shared if p.is_file()] + sorted((ROOT / "services").glob("*/*settings.py"))


def variables_read() -> dict[str, set[str]]:
    """Service (or "shared") -> the environment variables its settings classes read."""
    per_file = {path: parse_settings_file(path) for path in settings_files()}
    every_class = {n: c for classes in per_file.values() for n, c in classes.items()}

    def lineage(class_name: str) -> list[SettingsClass]:
        parsed = every_class.get(class_name)
        if parsed is None:
            return []
        return [parsed] + [c for base in parsed.bases for c in lineage(base)]

    def is_settings(class_name: str, seen: frozenset[str] = frozenset()) -> bool:
        parsed = every_class.get(class_name)
        if parsed is None or class_name in seen:
            return False
        return "BaseSettings" in parsed.bases or any(
            is_settings(b, seen | {class_name}) for b in parsed.bases
        )

    read: dict[str, set[str]] = {}
    for path, classes in per_file.items():
        owner = path.parent.name if path.parent.parent.name == "services" else "shared"
        for class_name in classes:
            if not is_settings(class_name):
                continue
            chain = lineage(class_name)
            prefix = next((c.env_prefix for c in chain if c.env_prefix is not None), "")
            names = {f"{prefix}{f}".upper() for c in chain for f in c.fields}
            names |= {a.upper() for c in chain for a in c.aliases}
            read.setdefault(owner, set()).update(names)
    return read


def test_the_parser_finds_what_pydantic_reads() -> None:
    """Against the imported classes, for every service whose settings import today."""
    read = variables_read()
    assert "shared" in read and f"{PREFIXED}NATS_URL" in read["shared"]
    from pydantic_settings import BaseSettings

    checked = 0
    for service in sorted(p.parent.name for p in (ROOT / "services").glob("*/settings.py")):
        try:
            module = importlib.import_module(f"services.{service}.settings")
        except Exception:  # being rewritten: the parsed names still count
            continue
        imported: set[str] = set()
        for cls in vars(module).values():
            if inspect.isclass(cls) and issubclass(cls, BaseSettings):
                if cls.__module__ == module.__name__:
                    prefix = cls.model_config.get("env_prefix", "")
                    for name, field in cls.model_fields.items():
                        alias = field.validation_alias
                        imported.add((alias if isinstance(alias, str) else prefix + name).upper())
        assert imported == read[service], f"{service}: {imported ^ read[service]}"
        checked += 1
    assert checked, "no settings class could be imported"


def test_the_parser_sees_aliases_and_prefixes(tmp_path: Path) -> None:
    source = tmp_path / "settings.py"
    source.write_text(
        "from pydantic import AliasChoices, Field\n"
        "from pydantic_settings import BaseSettings, SettingsConfigDict\n"
        "class A(BaseSettings):\n"
        "    model_config = SettingsConfigDict(env_prefix='X_')\n"
        "    one: int = 1\n"
        "    two: str = Field(default='', validation_alias=AliasChoices('TWO', 'DOS'))\n"
        "class B(A):\n"
        "    three: bool = False\n"
        "    _private: int = 0\n"
    )
    parsed = parse_settings_file(source)
    # `two` is read by its aliases only (X_TWO is not read).
    assert parsed["A"].env_prefix == "X_" and parsed["A"].fields == {"one"}
    assert parsed["A"].aliases == {"TWO", "DOS"}
    assert parsed["B"].bases == ["A"] and parsed["B"].fields == {"three"}


def _every_read() -> set[str]:
    return set().union(*variables_read().values())


@pytest.mark.parametrize("target", TARGETS)
def test_configmap_variables_are_read_by_a_service(target: str) -> None:
    known = _every_read()
    configmaps = [d for d in render(target) if d["kind"] == "ConfigMap"]
    assert configmaps
    for configmap in configmaps:
        unknown = {k for k in configmap.get("data", {}) if k.startswith(PREFIXED)} - known
        assert not unknown, f"{target}: {name(configmap)} sets {sorted(unknown)}: nothing reads"


@pytest.mark.parametrize("target", TARGETS)
def test_container_variables_are_read_by_that_service(target: str) -> None:
    read = variables_read()
    for workload in workloads(render(target)):
        for container in containers(workload):
            args = container.get("args") or []
            module = str(args[0]) if args else ""
            if not module.startswith("services."):
                continue
            service = module.removeprefix("services.")
            own = read.get(service, set()) | read["shared"]
            env = {e["name"] for e in container.get("env", []) if e["name"].startswith(PREFIXED)}
            assert not env - own, f"{target}: {name(workload)} sets {sorted(env - own)}"


def test_an_unknown_variable_would_be_caught() -> None:
    known = _every_read()
    assert f"{PREFIXED}NATS_URL" in known
    assert f"{PREFIXED}NATS_URLS" not in known
    assert f"{PREFIXED}LLM_MODEL" in known  # the reasoner's, through services/*/settings.py
