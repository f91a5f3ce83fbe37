"""How the `deckhands` command shows events and tasks (Rich): commands and their output as a
terminal would show them (bounded), file edits as diffs, delegation as a sentence."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

__all__ = [
    "OUTPUT_LINES",
    "age",
    "diff_renderable",
    "event_renderable",
    "money",
    "status_line",
    "task_table",
    "task_view",
]

# A command's output shows its first and last lines up to this many; the rest is cut, saying
# how much (the whole output stays in the log, or behind its content_ref).
OUTPUT_LINES = 40

_STATE_STYLE = {
    "FINISHED": "bold green",
    "ERROR": "bold red",
    "REJECTED": "bold red",
    "USER_REJECTED": "red",
    "STOPPED": "bold",
    "PAUSED": "yellow",
    "RATE_LIMITED": "yellow",
    "AWAITING_USER_INPUT": "bold magenta",
    "AWAITING_USER_CONFIRMATION": "bold magenta",
    "RUNNING": "cyan",
    "LOADING": "cyan",
    "USER_CONFIRMED": "cyan",
}


def state_text(state: str) -> Text:
    return Text(state, style=_STATE_STYLE.get(state, ""))


def money(usd: float | None) -> str:
    if usd is None:
        return "-"
    if usd == 0:
        return "$0"
    return f"${usd:.4f}" if usd < 0.01 else f"${usd:.2f}"


def age(iso: str | None, now: datetime | None = None) -> str:
    if not iso:
        return ""
    then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    if then.tzinfo is None:
        then = then.replace(tzinfo=UTC)
    seconds = max(0.0, ((now or datetime.now(UTC)) - then).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit} ago"
    return f"{int(seconds)}s ago"


def bounded(text: str, limit: int = OUTPUT_LINES) -> str:
    """The first and last lines of `text`, `limit` in all, with a note of what was left out."""
    lines = text.rstrip("\n").split("\n")
    if len(lines) <= limit:
        return "\n".join(lines)
    head = lines[: limit // 2]
    tail = lines[-(limit - len(head)) :]
    cut = len(lines) - len(head) - len(tail)
    return "\n".join([*head, f"... [{cut} lines not shown] ...", *tail])


_INDENT = "      "


def _indented(text: Text) -> Text:
    """`text` with each line indented under its heading (no padding to the terminal's width,
    so that piped output has no trailing blanks)."""
    out = Text()
    for number, line in enumerate(text.split("\n", allow_blank=True)):
        if number:
            out.append("\n")
        out.append(_INDENT)
        out.append_text(line)
    return out


def _terminal(text: str, *, prompt: str | None = None, style: str = "") -> Text:
    body = Text()
    if prompt is not None:
        body.append("$ ", style="bold green")
        body.append(prompt, style="bold")
        if text:
            body.append("\n")
    if text:
        body.append(bounded(text), style=style)
    return _indented(body)


def _diff(text: str) -> Text:
    body = Text()
    for number, line in enumerate(bounded(text, 200).split("\n")):
        if number:
            body.append("\n")
        body.append(line, style=_diff_style(line))
    return _indented(body)


def _diff_style(line: str) -> str:
    if line.startswith(("+++", "---", "diff --git")):
        return "bold"
    if line.startswith("@@"):
        return "cyan"
    if line.startswith("+"):
        return "green"
    if line.startswith("-"):
        return "red"
    return ""


def diff_renderable(text: str) -> Text:
    """A whole diff, coloured, not indented and not cut."""
    body = Text()
    for number, line in enumerate(text.rstrip("\n").split("\n")):
        if number:
            body.append("\n")
        body.append(line, style=_diff_style(line))
    return body


def _new_file_diff(path: str, content: str) -> Text:
    lines = content.rstrip("\n").split("\n") if content else []
    head = ["--- /dev/null", f"+++ {path}", f"@@ -0,0 +1,{len(lines)} @@"]
    return _diff("\n".join(head + ["+" + line for line in lines]))


def _para(text: str, style: str = "") -> Text:
    return _indented(Text(text.rstrip("\n"), style=style))


def _usage(event: dict[str, Any]) -> str:
    usage = event.get("llm_usage")
    if not usage:
        return ""
    tokens = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return f"  [dim]{tokens} tokens {money(usage.get('cost_usd'))}[/dim]"


def event_renderable(event: dict[str, Any]) -> RenderableType:
    """One event: a heading line (seq, who, what), then its body where it has one."""
    kind = event.get("kind", "?")
    seq = event.get("seq", "?")
    source = event.get("source", "")
    head = f"[dim]#{seq:<3}[/dim] "
    body: list[RenderableType] = []
    thought = event.get("thought") if source == "AGENT" and kind != "message" else ""
    if thought:
        body.append(_para(thought, "italic dim"))

    if kind == "message":
        who = (
            "[bold blue]you[/bold blue]"
            if source == "USER"
            else "[bold magenta]agent[/bold magenta]"
        )
        asks = " asks" if event.get("wait_for_response") else ""
        head += f"{who}{asks}"
        body.append(_para(event.get("content", "")))
    elif kind == "run":
        head += "[bold]runs[/bold]" if not event.get("is_input") else "[bold]types[/bold]"
        body.append(_terminal("", prompt=event.get("command", "")))
    elif kind in ("run_output", "python_output", "read_output"):
        code = event.get("exit_code")
        status = "" if code in (None, 0) else f" [red]exit {code}[/red]"
        if event.get("timed_out"):
            status += " [yellow]timed out[/yellow]"
        where = f" {escape(event.get('path', ''))}" if kind == "read_output" else ""
        head += f"[dim]output{where}[/dim]{status}"
        body.append(_terminal(event.get("content", ""), style="red" if status else ""))
        if event.get("content_ref"):
            ref = event["content_ref"]
            body.append(
                _para(
                    f"(cut; the whole output, {ref['size']} bytes, is blob {ref['sha256']})", "dim"
                )
            )
    elif kind == "run_python":
        head += "[bold]runs Python[/bold]"
        body.append(_terminal(event.get("code", "")))
    elif kind == "read":
        head += f"[bold]reads[/bold] {escape(event.get('path', ''))}"
    elif kind == "write":
        head += f"[bold]writes[/bold] {escape(event.get('path', ''))}"
        if event.get("content_ref"):
            body.append(
                _para(f"({event['content_ref']['size']} bytes, kept in the blob store)", "dim")
            )
        else:
            body.append(_new_file_diff(event.get("path", ""), event.get("content", "")))
    elif kind == "write_output":
        head += f"[dim]wrote {escape(event.get('path', ''))}[/dim]"
    elif kind == "edit":
        command = event.get("command", "")
        head += f"[bold]edits[/bold] {escape(event.get('path', ''))} [dim]({command})[/dim]"
        # The outcome (edit_output) shows the real diff; the action only a new file's content.
        if command == "create":
            body.append(_new_file_diff(event.get("path", ""), event.get("file_text") or ""))
    elif kind == "edit_output":
        head += f"[dim]edited {escape(event.get('path', ''))}[/dim]"
        body.append(
            _diff(event["diff"]) if event.get("diff") else _terminal(event.get("content", ""))
        )
    elif kind == "mcp_call":
        head += (
            f"[bold]calls[/bold] {escape(event.get('tool', ''))} "
            f"[dim](MCP server {escape(event.get('server', ''))})[/dim]"
        )
        body.append(_terminal(json.dumps(event.get("arguments") or {}, indent=2)))
    elif kind == "mcp_output":
        failed = " [red]error[/red]" if event.get("is_error") else ""
        head += f"[dim]{escape(event.get('tool', ''))} answered[/dim]{failed}"
        body.append(_terminal(event.get("content", ""), style="red" if failed else ""))
    elif kind == "think":
        head += "[dim]thinks[/dim]"
    elif kind == "finish":
        head += "[bold green]finished[/bold green]"
        body.append(_para(event.get("final_message", "")))
    elif kind == "error":
        head += f"[bold red]error[/bold red] [dim]{escape(event.get('error_code', ''))}[/dim]"
        body.append(_para(event.get("content", ""), "red"))
    elif kind == "agent_state_changed":
        before = event.get("previous_state") or "-"
        after = event.get("agent_state", "")
        head += f"[dim]{before} ->[/dim] "
        line = Text.from_markup(head)
        line.append_text(state_text(after))
        if event.get("reason"):
            line.append(f"  {event['reason']}", style="dim")
        return line
    elif kind == "security_verdict":
        style = "green" if event.get("verdict") == "ALLOW" else "bold red"
        rule = f" ({escape(event['rule'])})" if event.get("rule") else ""
        reason = f": {escape(event['reason'])}" if event.get("reason") else ""
        head += (
            f"[dim]security[/dim] [{style}]{event.get('verdict')}[/{style}] "
            f"[dim]risk {event.get('risk')}{rule}{reason}[/dim]"
        )
    elif kind == "delegate":
        limit = (
            f", at most {event['max_iterations']} iterations" if event.get("max_iterations") else ""
        )
        head += f"[bold magenta]delegates a sub-task[/bold magenta][dim]{limit}[/dim]"
        body.append(_para(event.get("task", "")))
    elif kind == "delegate_output":
        head += f"[magenta]sub-task {escape(event.get('sub_task_id', ''))} ended[/magenta] "
        line = Text.from_markup(head)
        line.append_text(state_text(event.get("agent_state", "")))
        parts: list[RenderableType] = [line]
        if event.get("content"):
            parts.append(_para(event["content"]))
        return Group(*parts)
    elif kind == "user_rejected":
        head += "[red]rejected by you[/red]"
    elif kind == "change_agent_state":
        head += f"[dim]asks for {event.get('agent_state')}[/dim]"
    elif kind == "task_created":
        budget = f", budget {money(event['max_budget_usd'])}" if event.get("max_budget_usd") else ""
        confirm = (
            f", confirmation from {event.get('confirmation_threshold')} risk"
            if event.get("confirmation_mode")
            else ""
        )
        limits = f"at most {event.get('max_iterations')} iterations{budget}{confirm}"
        head += f"[dim]task created: {limits}[/dim]"
    elif kind == "sandbox_queued":
        head += f"[yellow]waits for a sandbox: place {event.get('position')}[/yellow]"
    elif kind == "condensation":
        head += f"[dim]history condensed up to #{event.get('forgotten_up_to_seq')}[/dim]"
    else:
        head += f"[dim]{escape(kind)}[/dim]"
    head += _usage(event)
    return Group(Text.from_markup(head), *body) if body else Text.from_markup(head)


def status_line(task: dict[str, Any], elapsed_s: float) -> Text:
    usage = task.get("usage") or {}
    line = Text()
    line.append_text(state_text(task.get("state", "")))
    line.append(
        f"  {task.get('iterations', 0)}/{task.get('max_iterations', '?')} iterations"
        f"  {usage.get('total_tokens', 0)} tokens  {money(usage.get('cost_usd'))}"
        f"  {elapsed_s:.0f} s",
        style="dim",
    )
    return line


def task_table(tasks: list[dict[str, Any]], width: int = 120) -> Table:
    """One line per task. Every column keeps its width (an id is copied from here) and the
    task's text gets what is left of `width`, cut with an ellipsis."""
    rows = [
        [
            task["id"],
            task["state"],
            age(task.get("created_at")),
            str(task.get("iterations", "")),
            money(task.get("cost_usd")),
            " ".join(task.get("labels", [])),
            task["task"].splitlines()[0] if task["task"].strip() else "",
        ]
        for task in tasks
    ]
    headers = ["ID", "STATE", "AGE", "ITER", "COST", "LABELS", "TASK"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    left = width - sum(widths[:-1]) - 2 * (len(headers) - 1)
    table = Table(box=None, header_style="bold dim", pad_edge=False)
    for index, header in enumerate(headers[:-1]):
        right = header in ("AGE", "ITER", "COST")
        table.add_column(
            header, no_wrap=True, min_width=widths[index], justify="right" if right else "left"
        )
    table.add_column("TASK", no_wrap=True, overflow="ellipsis", max_width=max(12, left))
    for row in rows:
        table.add_row(*row[:1], state_text(row[1]), *row[2:])
    return table


def task_view(task: dict[str, Any]) -> Group:
    usage = task.get("usage") or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()
    grid.add_row("id", task["id"])
    grid.add_row(
        "state", Text.assemble(state_text(task["state"]), ("  " + task.get("reason", ""), "dim"))
    )
    grid.add_row("task", task["task"])
    grid.add_row("iterations", f"{task['iterations']} / {task['max_iterations']}")
    budget = f" of {money(task['max_budget_usd'])}" if task.get("max_budget_usd") else ""
    grid.add_row(
        "usage",
        f"{usage.get('total_tokens', 0)} tokens, {usage.get('llm_calls', 0)} LLM calls, "
        f"{money(usage.get('cost_usd'))}{budget}",
    )
    grid.add_row("created", f"{task.get('created_at')} ({age(task.get('created_at'))})")
    if task.get("labels"):
        grid.add_row("labels", " ".join(task["labels"]))
    if task.get("priority") == "batch":
        grid.add_row("priority", "batch")
    if task.get("queue_position"):
        estimate = task.get("queue_estimate_s")
        about = f", about {estimate:.0f} s" if isinstance(estimate, int | float) else ""
        grid.add_row("sandbox queue", f"place {task['queue_position']}{about}")
    if task.get("parent_task_id"):
        grid.add_row("parent", task["parent_task_id"])
    parts: list[RenderableType] = [grid]
    pending = task.get("pending_action")
    if task["state"] == "AWAITING_USER_CONFIRMATION" and pending:
        parts += [
            Text("\nawaiting your confirmation:", style="bold magenta"),
            event_renderable(pending),
        ]
    for sub in task.get("sub_tasks") or []:
        line = Text("sub-task ", style="magenta")
        line.append(sub["id"] + " ")
        line.append_text(state_text(sub["state"]))
        line.append(f"  {sub['task']}", style="dim")
        parts.append(line)
    if task.get("result"):
        parts += [Text("\nresult:", style="bold green"), Text(task["result"]["final_message"])]
    return Group(*parts)
