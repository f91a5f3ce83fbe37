"""Generate proto_schemas/: the event, command and sandbox-protocol JSON Schemas and one AsyncAPI
document.

    python -m tools.gen_schemas            # (re)writes proto_schemas/
    python -m tools.gen_schemas --check    # exits 1 with a diff when proto_schemas/ is stale

The AsyncAPI document is built from every service's broker: each `services/<svc>/main.py` that
defines `build_app()` is built with default settings (build_app does no I/O by contract). When
build_app returns something without a `broker` (the gateway's FastAPI app), a module of the
service that defines `build_<svc>_broker(settings)` supplies the broker instead (failing that,
`app.state.broker`).
"""

from __future__ import annotations

import argparse
import ast
import difflib
import importlib
import inspect
import json
import os
import sys
import tomllib
import types
import typing
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter
from pydantic.json_schema import models_json_schema

__all__ = [
    "EVENTS_FILE",
    "ROOT",
    "SCHEMA_DIR",
    "build_asyncapi",
    "check",
    "commands_schema",
    "discover_brokers",
    "event_schema",
    "generate",
    "main",
    "sandbox_protocol_schema",
    "service_names",
    "write",
]

ROOT = Path(__file__).resolve().parent.parent
SCHEMA_DIR = ROOT / "proto_schemas"
EVENTS_FILE = "events.schema.json"
COMMANDS_FILE = "commands.schema.json"
ASYNCAPI_FILE = "asyncapi.json"
SANDBOX_FILE = "sandbox_protocol.schema.json"
REGENERATE_HINT = "run `make schemas` (or `python -m tools.gen_schemas`) and commit proto_schemas/"


JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _dump(document: Any) -> str:
    # sort_keys + fixed indent + trailing newline: the same input always gives the same bytes.
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as fh:
        return str(tomllib.load(fh)["project"]["version"])


def event_schema() -> dict[str, Any]:
    from shared.events import Event

    schema = TypeAdapter(Event).json_schema()
    schema["$schema"] = JSON_SCHEMA_DIALECT
    schema["title"] = "Event"
    schema["description"] = (
        "Every deckhands event: one discriminated union on the field `kind` (shared.events.Event)."
    )
    return schema


def commands_schema() -> dict[str, Any]:
    """Each work order in shared.commands as its own definition (they share no union)."""
    import shared.commands as commands

    models = [
        getattr(commands, name)
        for name in sorted(commands.__all__)
        if isinstance(getattr(commands, name), type)
        and issubclass(getattr(commands, name), BaseModel)
    ]
    _, schema = models_json_schema(
        [(model, "validation") for model in models],
        title="deckhands commands",
        description="Work orders between services (shared.commands); they are not events.",
    )
    schema["$schema"] = JSON_SCHEMA_DIALECT
    return schema


def service_names() -> list[str]:
    """Every services/<name>/ whose main.py defines a top-level build_app function."""
    names = []
    for main_py in sorted((ROOT / "services").glob("*/main.py")):
        tree = ast.parse(main_py.read_text(encoding="utf-8"), str(main_py))
        if any(
            isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "build_app"
            for node in tree.body
        ):
            names.append(main_py.parent.name)
    return names


def _broker_factory_module(service: str) -> str | None:
    """The module of services/<service>/ that defines build_<service>_broker, found by AST
    so that no other module is imported just to look."""
    wanted = f"build_{service}_broker"
    for path in sorted((ROOT / "services" / service).rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if any(isinstance(n, ast.FunctionDef) and n.name == wanted for n in tree.body):
            relative = path.relative_to(ROOT).with_suffix("")
            return ".".join(relative.parts)
    return None


def _default_settings_for(factory: Any, service: str) -> Any:
    """Default settings for a `build_<svc>_broker(settings)` whose argument is required."""
    hints = typing.get_type_hints(factory)
    first = next(iter(inspect.signature(factory).parameters))
    annotation = hints.get(first)
    candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and candidate is not type(None):
            return candidate()
    raise RuntimeError(
        f"services.{service}: cannot tell which settings class build_{service}_broker takes; "
        "annotate its first parameter with the service's settings class"
    )


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _broker_of(service: str) -> Any:
    """The service's broker, with the receivers it runs outside FastStream declared on it
    (`declare_direct_receivers(broker)` in its main module): this broker is never started."""
    main_module = importlib.import_module(f"services.{service}.main")
    broker = _built_broker(service, main_module)
    declare = getattr(main_module, "declare_direct_receivers", None)
    if broker is not None and declare is not None:
        declare(broker)
    return broker


def _built_broker(service: str, main_module: types.ModuleType) -> Any:
    try:
        app = main_module.build_app()
    except Exception as exc:
        raise RuntimeError(
            f"services.{service}.main.build_app() failed with default settings: {exc!r}. "
            "build_app must only wire things up (no I/O) and work with default settings."
        ) from exc
    broker = getattr(app, "broker", None)
    if broker is not None:
        return broker
    module_name = _broker_factory_module(service)
    if module_name is None:
        # A web app may keep its broker in app.state; a service without one has no channels.
        return getattr(getattr(app, "state", None), "broker", None)
    factory = getattr(importlib.import_module(module_name), f"build_{service}_broker")
    parameters = inspect.signature(factory).parameters
    required = [p for p in parameters.values() if p.default is inspect.Parameter.empty]
    return factory(_default_settings_for(factory, service)) if required else factory()


@contextmanager
def _clean_environment() -> Iterator[None]:
    """Without DECKHANDS_* variables, every broker URL in the document is the default one.
    The runtime's own queue is named for its replica (the host's name by default): the
    document names it `REPLICA`, the same on every machine."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("DECKHANDS_")}
    for key in saved:
        del os.environ[key]
    os.environ["DECKHANDS_RUNTIME_REPLICA"] = "REPLICA"
    try:
        yield
    finally:
        os.environ.pop("DECKHANDS_RUNTIME_REPLICA", None)
        os.environ.update(saved)


def discover_brokers() -> dict[str, Any]:
    """service name -> its broker, for every service that has one."""
    brokers = {}
    with _clean_environment():
        for service in service_names():
            broker = _broker_of(service)
            if broker is not None:
                brokers[service] = broker
    return brokers


def build_asyncapi() -> dict[str, Any]:
    from faststream.specification import AsyncAPI

    brokers = discover_brokers()
    with warnings.catch_warnings():
        # FastStream keeps only one of two channels with the same name: a silent loss here.
        warnings.filterwarnings("error", message="Overwrite broker", category=RuntimeWarning)
        specification = AsyncAPI(
            *brokers.values(),
            title="deckhands",
            version=_project_version(),
            description=(
                "Every NATS channel the deckhands services consume, generated by "
                f"tools/gen_schemas.py from the brokers of: {', '.join(brokers)}."
            ),
        ).to_specification()
    document: dict[str, Any] = json.loads(specification.to_json())
    return document


def sandbox_protocol_schema() -> dict[str, Any]:
    """The runtime-executor contract (shared.sandbox_protocol): each op's request and reply."""
    from shared.sandbox_protocol import PROTOCOL_VERSION
    from shared.sandbox_protocol.messages import OPERATIONS, ErrorReply

    definitions: dict[str, Any] = {}

    def ref(kind: type) -> dict[str, str]:
        schema = TypeAdapter(kind).json_schema(ref_template="#/$defs/{model}")
        definitions.update(schema.pop("$defs", {}))
        definitions[kind.__name__] = schema
        return {"$ref": f"#/$defs/{kind.__name__}"}

    refusal = ref(ErrorReply)
    operations = {
        op: {"request": ref(request), "reply": {"oneOf": [ref(reply), refusal]}}
        for op, (request, reply) in OPERATIONS.items()
    }
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "title": "deckhands sandbox protocol",
        "description": (
            "One JSON object per line between the runtime and the in-sandbox executor "
            "(shared.sandbox_protocol). A request is {id, op, ...the op's request fields}; its "
            "reply carries the same id, and is the op's reply or an ErrorReply."
        ),
        "x-protocol-version": PROTOCOL_VERSION,
        "x-operations": operations,
        "$defs": dict(sorted(definitions.items())),
    }


def generate() -> dict[str, str]:
    """File name in proto_schemas/ -> its exact content."""
    return {
        EVENTS_FILE: _dump(event_schema()),
        COMMANDS_FILE: _dump(commands_schema()),
        ASYNCAPI_FILE: _dump(build_asyncapi()),
        SANDBOX_FILE: _dump(sandbox_protocol_schema()),
    }


def write(files: dict[str, str], out_dir: Path = SCHEMA_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out_dir / name).write_text(text, encoding="utf-8")


def check(files: dict[str, str], out_dir: Path = SCHEMA_DIR) -> list[str]:
    """Problems with out_dir against freshly generated files; empty when it is up to date."""
    problems = []
    for name, expected in files.items():
        path = out_dir / name
        if not path.exists():
            problems.append(f"{path} is missing")
            continue
        current = path.read_text(encoding="utf-8")
        if current != expected:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                fromfile=f"{name} (committed)",
                tofile=f"{name} (generated)",
                n=2,
            )
            lines = list(diff)
            shown = "".join(lines[:80]) + ("...\n" if len(lines) > 80 else "")
            problems.append(f"{path} is out of date:\n{shown}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the files are stale")
    parser.add_argument("--out", type=Path, default=SCHEMA_DIR, help="output folder")
    args = parser.parse_args(argv)

    files = generate()
    if args.check:
        problems = check(files, args.out)
        if problems:
            print("\n".join(problems), file=sys.stderr)
            print(f"proto_schemas is out of date: {REGENERATE_HINT}", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    write(files, args.out)
    print(f"wrote {', '.join(sorted(files))} to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
