"""The `deckhands` command: post tasks to a deckhands gateway, follow them live, steer them.

    deckhands run "Write a Python script that prints the squares of 1 to 10 and run it"
    deckhands tasks --state RUNNING --label team=payments
    deckhands logs -f <id>
    deckhands approve <id>            # or reject, stop, pause, resume
    deckhands say <id> "use port 8080"

The gateway's URL and the API key come from --url / --api-key, else DECKHANDS_URL /
DECKHANDS_API_KEY, else ~/.config/deckhands/config.toml (`url = ...`, `api_key = ...`), else,
in a deckhands checkout, http://127.0.0.1:8000 and the key `make up` wrote to .run/api_key.

Exit codes of `run` and `logs -f` (the task's final state): 0 FINISHED, 1 ERROR, 3 STOPPED,
4 REJECTED, 5 the agent asks a question and nobody is at the keyboard (answer with `say`);
every command: 2 bad usage, 6 the gateway refused the request or could not be reached,
124 --timeout passed, 130 Ctrl-C (the task goes on).
"""

from __future__ import annotations

import json
import os
import sys
import time
from enum import IntEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.live import Live
from rich.prompt import Confirm, Prompt
from rich.text import Text

from .client import ENDED_STATES, ApiError, Client, is_terminal
from .config import DEFAULT_URL, ConfigError, Target, config_path, resolve
from .render import diff_renderable, event_renderable, status_line, task_table, task_view

__all__ = ["Exit", "app", "main"]


class Exit(IntEnum):
    FINISHED = 0
    ERROR = 1
    USAGE = 2
    STOPPED = 3
    REJECTED = 4
    AWAITS_INPUT = 5
    REFUSED = 6
    TIMEOUT = 124
    INTERRUPTED = 130


_BY_STATE = {
    "FINISHED": Exit.FINISHED,
    "ERROR": Exit.ERROR,
    "STOPPED": Exit.STOPPED,
    "REJECTED": Exit.REJECTED,
    "AWAITING_USER_INPUT": Exit.AWAITS_INPUT,
}

app = typer.Typer(
    name="deckhands",
    help=__doc__,
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)

console = Console(highlight=False)
# Messages are not wrapped: a line of them can be searched for as it is.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class _Options:
    def __init__(self, url: str | None, api_key: str | None, api_key_file: Path | None) -> None:
        self.url = url
        self.api_key = api_key
        self.api_key_file = api_key_file

    def target(self) -> Target:
        try:
            return resolve(self.url, self.api_key, self.api_key_file)
        except ConfigError as exc:
            _fail(str(exc), Exit.USAGE)

    def client(self) -> Client:
        target = self.target()
        return Client(target.url, target.api_key)


def _fail(message: str, code: Exit) -> NoReturn:
    err_console.print(Text(f"deckhands: {message}", style="red"))
    raise typer.Exit(int(code))


def _options(ctx: typer.Context) -> _Options:
    options = ctx.find_object(_Options)
    return options if options is not None else _Options(None, None, None)


@app.callback()
def _global(
    ctx: typer.Context,
    url: Annotated[
        str | None, typer.Option("--url", help="The gateway (default: DECKHANDS_URL, config).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option("--api-key", help="An API key (default: DECKHANDS_API_KEY, config)."),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option("--api-key-file", help="A file holding the API key.")
    ] = None,
) -> None:
    ctx.obj = _Options(url, api_key, api_key_file)


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        _fail(str(exc), Exit.REFUSED)


# --- following a task ------------------------------------------------------------------------


class _Follower:
    """Prints a task's events as they come, with a live status line on a terminal, until the
    task ends (or waits for a person who is not at the keyboard)."""

    def __init__(
        self,
        client: Client,
        task_id: str,
        *,
        timeout_s: float | None,
        interactive: bool,
        as_json: bool = False,
    ) -> None:
        self.client = client
        self.task_id = task_id
        self.interactive = interactive
        self.as_json = as_json
        self.started = time.monotonic()
        self.deadline = None if timeout_s is None else self.started + timeout_s
        self.task: dict[str, Any] = {}
        self.live: Live | None = None
        self.hinted: set[str] = set()
        self.shown_result = ""  # the final message of the last finish event shown
        self.ended = False

    def _print(self, renderable: Any) -> None:
        (self.live.console if self.live else console).print(renderable)

    def _refresh(self) -> None:
        """The task's view again. A gateway restarting or unreachable for a moment (the
        stream reconnects meanwhile) is waited out for up to a minute."""
        give_up = time.monotonic() + 60
        while True:
            try:
                self.task = self.client.task(self.task_id)
                return
            except ApiError as exc:
                transient = exc.status == 0 or exc.status in (502, 503, 504)
                if not transient or time.monotonic() > give_up:
                    _fail(str(exc), Exit.REFUSED)
                time.sleep(1)

    def __rich__(self) -> Text:
        """The live status line, drawn again 4 times a second (the clock moves)."""
        return status_line(self.task, time.monotonic() - self.started)

    def run(self, after: int = 0) -> Exit:
        try:
            self.task = _call(self.client.task, self.task_id)
            if not console.is_terminal or self.as_json:
                code = self._loop(after)
            else:
                with Live(self, console=console, transient=True, refresh_per_second=4) as live:
                    self.live = live
                    code = self._loop(after)
                self.live = None
        except KeyboardInterrupt:
            # Ctrl-C leaves the task alone: it runs on the servers, not here.
            err_console.print(
                Text(
                    f"stopped following task {self.task_id}; it goes on "
                    f"(deckhands logs -f {self.task_id}, or deckhands stop {self.task_id})",
                    style="yellow",
                )
            )
            return Exit.INTERRUPTED
        if self.ended:
            self._summary()
        return code

    def _loop(self, after: int) -> Exit:
        events = self.client.follow(
            self.task_id,
            after,
            stop_at_end=False,
            deadline=self.deadline,
            # On stderr: stdout stays the events (JSON lines with --json).
            on_reconnect=lambda why: err_console.print(Text(f"[stream: {why}]", style="yellow")),
        )
        try:
            for event in events:
                if self.as_json:
                    print(json.dumps(event), flush=True)
                else:
                    self._print(event_renderable(event))
                if event.get("kind") == "finish":
                    self.shown_result = event.get("final_message", "")
                if event.get("kind") == "agent_state_changed" or event.get("llm_usage"):
                    self._refresh()
                outcome = self._after(event)
                if outcome is not None:
                    return outcome
        except TimeoutError:
            return self._timed_out()
        except ApiError as exc:
            _fail(str(exc), Exit.REFUSED)
        return Exit.REFUSED  # the stream never ends by itself

    def _timed_out(self) -> Exit:
        err_console.print(
            Text(
                f"deckhands: task {self.task_id} still {self.task.get('state')} after the "
                "timeout; it goes on (follow it with `deckhands logs -f`)",
                style="yellow",
            )
        )
        return Exit.TIMEOUT

    def _after(self, event: dict[str, Any]) -> Exit | None:
        """What the task's latest state asks of us: None to go on following."""
        if event.get("kind") != "agent_state_changed":
            return None
        state = self.task.get("state", "")
        if is_terminal(event) and state in ENDED_STATES:
            return self._end()
        if state == "AWAITING_USER_CONFIRMATION" and event.get("agent_state") == state:
            self._confirm()
        elif state == "AWAITING_USER_INPUT" and event.get("agent_state") == state:
            if not self.interactive:
                self._print(
                    Text(
                        f'the agent waits for your answer: deckhands say {self.task_id} "..."',
                        style="magenta",
                    )
                )
                return Exit.AWAITS_INPUT
            self._answer()
        return None

    def _end(self) -> Exit:
        self.ended = True
        return _BY_STATE.get(self.task.get("state", ""), Exit.ERROR)

    def _summary(self) -> None:
        if self.as_json:
            return
        result = self.task.get("result")
        console.print()
        console.print(status_line(self.task, time.monotonic() - self.started))
        if result and result["final_message"] != self.shown_result:
            console.print(Text("result:", style="bold green"))
            console.print(Text(result["final_message"]))
        elif self.task.get("reason") and self.task.get("state") != "FINISHED":
            console.print(Text(f"reason: {self.task['reason']}", style="red"))

    def _confirm(self) -> None:
        pending = self.task.get("pending_action") or {}
        if not self.interactive:
            if pending.get("id") not in self.hinted:
                self.hinted.add(pending.get("id", ""))
                self._print(
                    Text(
                        f"waiting for your approval: deckhands approve {self.task_id} "
                        f"(or reject), or the web console",
                        style="magenta",
                    )
                )
            return
        if self.live:
            self.live.stop()
        try:
            console.print(Text("the agent wants to run:", style="bold magenta"))
            console.print(event_renderable(pending))
            approve = Confirm.ask("approve it?", console=console, default=False)
        finally:
            if self.live:
                self.live.start()
        _call(self.client.confirm, self.task_id, pending["id"], approve)

    def _answer(self) -> None:
        if self.live:
            self.live.stop()
        try:
            answer = ""
            while not answer.strip():
                answer = Prompt.ask("[bold magenta]your answer[/bold magenta]", console=console)
        finally:
            if self.live:
                self.live.start()
        _call(self.client.say, self.task_id, answer)


def _interactive(choice: bool | None) -> bool:
    if choice is not None:
        return choice
    return sys.stdin.isatty() and console.is_terminal


# --- commands --------------------------------------------------------------------------------

_STATES = [
    "LOADING",
    "RUNNING",
    "AWAITING_USER_INPUT",
    "AWAITING_USER_CONFIRMATION",
    "USER_CONFIRMED",
    "USER_REJECTED",
    "PAUSED",
    "RATE_LIMITED",
    "FINISHED",
    "ERROR",
    "STOPPED",
    "REJECTED",
]


@app.command()
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
        bool, typer.Option("--network", help="Network access for the sandbox.")
    ] = False,
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
    if not text.strip():
        _fail("the task is empty", Exit.USAGE)
    body: dict[str, Any] = {"task": text}
    if max_iterations is not None:
        body["max_iterations"] = max_iterations
    if budget is not None:
        body["max_budget_usd"] = budget
    if confirm is not None:
        body["confirmation_mode"] = confirm
    if threshold is not None:
        if threshold.upper() not in {"LOW", "MEDIUM", "HIGH", "UNKNOWN"}:
            _fail(f"--threshold {threshold!r}: use LOW, MEDIUM, HIGH or UNKNOWN", Exit.USAGE)
        body["confirmation_threshold"] = threshold.upper()
    if label:
        body["labels"] = label
    if network:
        body["network_egress"] = True
    if batch:
        body["priority"] = "batch"
    if secret:
        body["secrets"] = secret
    if repo is not None:
        body["repository"] = {"url": repo}
        if ref is not None:
            body["repository"]["ref"] = ref
        if repo_token_secret is not None:
            body["repository"]["token_secret"] = repo_token_secret
    elif ref is not None or repo_token_secret is not None:
        _fail("--ref and --repo-token-secret need --repo", Exit.USAGE)
    with _options(ctx).client() as client:
        created = _call(client.create_task, body)
        task_id = created["id"]
        if detach:
            print(task_id)
            return
        if not as_json:
            console.print(Text.assemble(("task ", "dim"), (task_id, "bold"), (" accepted", "dim")))
        follower = _Follower(
            client,
            task_id,
            timeout_s=timeout,
            interactive=_interactive(interactive),
            as_json=as_json,
        )
        code = follower.run()
    raise typer.Exit(int(code))


@app.command()
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
        _fail(str(exc), Exit.USAGE)
    with Client(target.url, target.api_key) as client:
        quotas = _call(client.request, "GET", "/v1/quotas")
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created private before the key is written into it.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"url = {json.dumps(target.url)}\napi_key = {json.dumps(target.api_key)}\n")
    os.chmod(path, 0o600)
    console.print(f"signed in to {target.url} as tenant {quotas['tenant_id']}; kept in {path}")


@app.command()
def tasks(
    ctx: typer.Context,
    state: Annotated[
        list[str] | None, typer.Option("--state", "-s", help="Only these states (repeat).")
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="Only with all these labels.")
    ] = None,
    active: Annotated[bool, typer.Option("--active", help="Only tasks not ended.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="The tasks as JSON.")] = False,
) -> None:
    """Your tasks, newest first."""
    states = [s.upper() for s in state or []]
    unknown = [s for s in states if s not in _STATES]
    if unknown:
        _fail(f"unknown state {unknown[0]!r}; one of {', '.join(_STATES)}", Exit.USAGE)
    if active:
        states = [s for s in _STATES if s not in ENDED_STATES and (not states or s in states)]
    found: list[dict[str, Any]] = []
    cursor = None
    with _options(ctx).client() as client:
        while len(found) < limit:
            page = _call(
                client.tasks,
                states=states,
                labels=label or [],
                limit=min(100, limit - len(found)),
                cursor=cursor,
            )
            found += page["tasks"]
            cursor = page["next_cursor"]
            if not cursor:
                break
    if as_json:
        print(json.dumps(found, indent=2))
        return
    if not found:
        console.print(Text("no task matches", style="dim"))
        return
    console.print(task_table(found, console.width))
    if cursor:
        console.print(Text(f"(more: --limit {limit * 2})", style="dim"))


@app.command()
def show(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """A task's state, usage, pending action and result."""
    with _options(ctx).client() as client:
        task = _call(client.task, task_id)
    if as_json:
        print(json.dumps(task, indent=2))
    else:
        console.print(task_view(task))


@app.command()
def logs(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep following until the task ends.")
    ] = False,
    after: Annotated[int, typer.Option("--after", min=0, help="Only events after this seq.")] = 0,
    timeout: Annotated[float | None, typer.Option("--timeout")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Events as JSON lines.")] = False,
) -> None:
    """A task's events; with -f, live until it ends (exit code by its final state)."""
    with _options(ctx).client() as client:
        if follow:
            follower = _Follower(
                client, task_id, timeout_s=timeout, interactive=False, as_json=as_json
            )
            raise typer.Exit(int(follower.run(after)))
        try:
            for event in client.history(task_id, after):
                if as_json:
                    print(json.dumps(event))
                else:
                    console.print(event_renderable(event))
        except ApiError as exc:
            _fail(str(exc), Exit.REFUSED)


def _confirmation(ctx: typer.Context, task_id: str, action_id: str | None, approve: bool) -> None:
    with _options(ctx).client() as client:
        task = _call(client.task, task_id)
        pending = task.get("pending_action")
        if task["state"] != "AWAITING_USER_CONFIRMATION" or not pending:
            _fail(
                f"task {task_id} is {task['state']}: no action awaits a confirmation",
                Exit.REFUSED,
            )
        if action_id is not None and pending["id"] != action_id:
            _fail(
                f"the action awaiting confirmation is {pending['id']}, not {action_id}",
                Exit.REFUSED,
            )
        _call(client.confirm, task_id, pending["id"], approve)
    console.print(Text("approved:" if approve else "rejected:", style="bold"))
    console.print(event_renderable(pending))


@app.command()
def approve(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    action: Annotated[
        str | None, typer.Option("--action", help="Only if this is the action waiting.")
    ] = None,
) -> None:
    """Let the action awaiting confirmation run."""
    _confirmation(ctx, task_id, action, True)


@app.command()
def reject(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    action: Annotated[
        str | None, typer.Option("--action", help="Only if this is the action waiting.")
    ] = None,
) -> None:
    """Refuse the action awaiting confirmation (the agent is told, and goes on)."""
    _confirmation(ctx, task_id, action, False)


def _control(ctx: typer.Context, task_id: str, what: str, done: str) -> None:
    with _options(ctx).client() as client:
        _call(client.control, task_id, what)
    console.print(f"task {task_id}: {done}")


@app.command()
def stop(ctx: typer.Context, task_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Stop the task for good (and its sub-tasks)."""
    _control(ctx, task_id, "stop", "stop asked")


@app.command()
def pause(ctx: typer.Context, task_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Pause the task (an action already running completes)."""
    _control(ctx, task_id, "pause", "pause asked")


@app.command()
def resume(ctx: typer.Context, task_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """Resume a paused task."""
    _control(ctx, task_id, "resume", "resume asked")


@app.command()
def say(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    message: Annotated[str, typer.Argument(help="The message ('-': read stdin).")],
) -> None:
    """Send the agent a message: an answer to its question, or more work for an ended task."""
    text = sys.stdin.read() if message == "-" else message
    if not text.strip():
        _fail("the message is empty", Exit.USAGE)
    with _options(ctx).client() as client:
        _call(client.say, task_id, text)
    console.print(f"task {task_id}: message sent")


@app.command()
def trajectory(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write it here (default: stdout).")
    ] = None,
) -> None:
    """The task's whole event log as JSON (it can be posted back as a replay)."""
    with _options(ctx).client() as client:
        data = _call(client.trajectory, task_id)
    text = json.dumps(data, indent=2)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n")
        err_console.print(f"{len(data['events'])} events written to {output}")


@app.command()
def workspace(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Default: workspace-ID.tar.gz, or the file's name."),
    ] = None,
    path: Annotated[
        str | None, typer.Option("--path", help="Only this file of the workspace.")
    ] = None,
) -> None:
    """Download the task's workspace as a tar.gz (or one file of it)."""
    if output is None:
        output = Path(Path(path).name if path else f"workspace-{task_id}.tar.gz")
    with _options(ctx).client() as client:
        written = _call(client.download_workspace, task_id, output, path)
    console.print(f"{written} bytes written to {output}")


@app.command()
def upload(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    source: Annotated[
        Path, typer.Argument(exists=True, dir_okay=False, help="A .tar[.gz] or .zip, or a file.")
    ],
    path: Annotated[
        str | None,
        typer.Option("--path", help="Where in /workspace (an archive: under it; a file: as it)."),
    ] = None,
) -> None:
    """Upload into the task's workspace: an archive is extracted, another file written."""
    with _options(ctx).client() as client:
        result = _call(client.upload_workspace, task_id, source, path)
    console.print(f"task {task_id}: {result.get('files', '?')} file(s) written")


@app.command()
def diff(ctx: typer.Context, task_id: Annotated[str, typer.Argument(metavar="ID")]) -> None:
    """The changes in the task's workspace, as a git diff (against its repository's commit or
    the tree last uploaded)."""
    with _options(ctx).client() as client:
        text = _call(client.workspace_diff, task_id)
    if not console.is_terminal:
        sys.stdout.write(text)  # as it is: `deckhands diff ID | git apply` works
        return
    console.print(diff_renderable(text) if text else Text("no change", style="dim"))


@app.command()
def delete(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
) -> None:
    """Stop the task if need be and remove it: its log, State, blobs and sub-tasks."""
    if not yes and not Confirm.ask(f"delete task {task_id} and its log for good?", console=console):
        raise typer.Exit(int(Exit.USAGE))
    with _options(ctx).client() as client:
        _call(client.delete, task_id)
    console.print(f"task {task_id} deleted")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
