"""`deckhands run` (post a task and follow it) and `deckhands login` (keep a URL and a key)."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Any

import typer
from rich.text import Text

from ..client import Client
from ..common import Exit, call, console, fail, options
from ..config import DEFAULT_URL, ConfigError, config_path, resolve
from ..follow import Follower

__all__ = ["login", "run"]

_THRESHOLDS = {"LOW", "MEDIUM", "HIGH", "UNKNOWN"}

# The task's egress policy (`network`), through the egress proxy only.
_Allow = Annotated[
    list[str] | None,
    typer.Option(
        "--allow",
        help="A host, *.domain, address or CIDR (optional :port) the sandbox may reach "
        "through the egress proxy (repeat for more).",
    ),
]
_Preset = Annotated[
    list[str] | None,
    typer.Option("--preset", help="An operator's egress preset, e.g. python (repeat)."),
]
_BetweenActions = Annotated[
    list[str] | None,
    typer.Option(
        "--between-actions",
        help="A rule of --allow a process left running may still reach between actions.",
    ),
]


def run(
    ctx: typer.Context,
    task: Annotated[str, typer.Argument(help="What the agent should do ('-': read stdin).")],
    max_iterations: Annotated[
        int | None, typer.Option("--max-iterations", "-n", min=1, max=1000)
    ] = None,
    budget: Annotated[
        float | None, typer.Option("--budget", help="Spend limit in USD.", min=0.0)
    ] = None,
    confirm: Annotated[
        bool | None,
        typer.Option("--confirm/--no-confirm", help="Ask before risky actions (server default)."),
    ] = None,
    threshold: Annotated[
        str | None,
        typer.Option("--threshold", help="Lowest risk that asks: LOW, MEDIUM, HIGH, UNKNOWN."),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="A label (repeat for more).")
    ] = None,
    network: Annotated[
        bool,
        typer.Option("--network", help="All the network access the operator allows the task."),
    ] = False,
    allow: _Allow = None,
    preset: _Preset = None,
    between_actions: _BetweenActions = None,
    repo: Annotated[
        str | None, typer.Option("--repo", help="A git repository to check out into /workspace.")
    ] = None,
    ref: Annotated[
        str | None, typer.Option("--ref", help="Its branch, tag or commit (default branch).")
    ] = None,
    repo_token_secret: Annotated[
        str | None,
        typer.Option("--repo-token-secret", help="The secret holding the repository's token."),
    ] = None,
    secret: Annotated[
        list[str] | None,
        typer.Option("--secret", help="A secret the task's commands get (repeat for more)."),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option("--timeout", help="Stop following after this many seconds.")
    ] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Print the task's id and return at once.")
    ] = False,
    interactive: Annotated[
        bool | None,
        typer.Option(
            "--interactive/--no-interactive",
            help="Answer confirmations and questions here (default: when on a terminal).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Events as JSON lines.")] = False,
    batch: Annotated[
        bool,
        typer.Option(
            "--batch",
            help="Post it as batch work: the tenant's interactive tasks take free seats first.",
        ),
    ] = False,
) -> None:
    """Post a task, follow its events live, print the result; exit code by its final state."""
    text = sys.stdin.read() if task == "-" else task
    body = _body(text, max_iterations, budget, confirm, threshold, label, network, batch, secret)
    repository = _repository(repo, ref, repo_token_secret)
    if repository is not None:
        body["repository"] = repository
    if allow or preset or between_actions:
        body["network"] = _network(allow, preset, between_actions)
    with options(ctx).client() as client:
        task_id = call(client.create_task, body)["id"]
        if detach:
            print(task_id)
            return
        code = _follow(client, task_id, timeout, _interactive(interactive), as_json)
    raise typer.Exit(int(code))


def _follow(
    client: Client, task_id: str, timeout: float | None, interactive: bool, as_json: bool
) -> Exit:
    """The task just accepted, followed until it ends: the exit code its final state gives."""
    if not as_json:
        console.print(Text.assemble(("task ", "dim"), (task_id, "bold"), (" accepted", "dim")))
    follower = Follower(
        client, task_id, timeout_s=timeout, interactive=interactive, as_json=as_json
    )
    return follower.run()


def _body(
    text: str,
    max_iterations: int | None,
    budget: float | None,
    confirm: bool | None,
    threshold: str | None,
    label: list[str] | None,
    network: bool,
    batch: bool,
    secret: list[str] | None,
) -> dict[str, Any]:
    """The task's request, but for its repository (a bad value fails as bad usage)."""
    if not text.strip():
        fail("the task is empty", Exit.USAGE)
    body: dict[str, Any] = {"task": text}
    if max_iterations is not None:
        body["max_iterations"] = max_iterations
    if budget is not None:
        body["max_budget_usd"] = budget
    if confirm is not None:
        body["confirmation_mode"] = confirm
    if threshold is not None:
        if threshold.upper() not in _THRESHOLDS:
            fail(f"--threshold {threshold!r}: use LOW, MEDIUM, HIGH or UNKNOWN", Exit.USAGE)
        body["confirmation_threshold"] = threshold.upper()
    if label:
        body["labels"] = label
    if network:
        body["network_egress"] = True
    if batch:
        body["priority"] = "batch"
    if secret:
        body["secrets"] = secret
    return body


def _network(
    allow: list[str] | None, presets: list[str] | None, between_actions: list[str] | None
) -> dict[str, list[str]]:
    """The task's egress policy as asked: rules, the operator's presets, what holds between
    actions (the gateway checks each against the bound, 422 naming the rule)."""
    return {
        "allow": allow or [],
        "presets": presets or [],
        "between_actions": between_actions or [],
    }


def _repository(
    repo: str | None, ref: str | None, token_secret: str | None
) -> dict[str, Any] | None:
    """The repository to check out, if any; --ref and --repo-token-secret need --repo."""
    if repo is None:
        if ref is not None or token_secret is not None:
            fail("--ref and --repo-token-secret need --repo", Exit.USAGE)
        return None
    repository: dict[str, Any] = {"url": repo}
    if ref is not None:
        repository["ref"] = ref
    if token_secret is not None:
        repository["token_secret"] = token_secret
    return repository


def _interactive(choice: bool | None) -> bool:
    if choice is not None:
        return choice
    return sys.stdin.isatty() and console.is_terminal


def login(
    ctx: typer.Context,
    url: Annotated[str, typer.Option("--url", prompt="gateway URL")] = DEFAULT_URL,
) -> None:
    """Check an API key against a gateway and keep both in the config file (mode 0600), so
    that later commands need neither flag nor environment."""
    key = typer.prompt("API key", hide_input=True).strip()
    try:
        target = resolve(url, key)
    except ConfigError as exc:
        fail(str(exc), Exit.USAGE)
    with Client(target.url, target.api_key) as client:
        quotas = call(client.request, "GET", "/v1/quotas")
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created private before the key is written into it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"url = {json.dumps(target.url)}\napi_key = {json.dumps(target.api_key)}\n")
    os.chmod(path, 0o600)
    console.print(f"signed in to {target.url} as tenant {quotas['tenant_id']}; kept in {path}")
