"""How the `deckhands` command shows one event of a task (Rich): a heading line (seq, who, what)
and, where the kind has one, a body: commands and their output as a terminal would show them
(bounded), file edits as diffs, delegation as a sentence. One small renderer per kind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.text import Text

from .formats import bounded, diff_style, money, state_text

__all__ = ["event_renderable"]

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
        body.append(line, style=diff_style(line))
    return _indented(body)


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


# What a kind of event adds to its heading line (after its seq) and the body under it.
_Shown = tuple[str, list[RenderableType]]


def event_renderable(event: dict[str, Any]) -> RenderableType:
    """One event: a heading line (seq, who, what), then its body where it has one."""
    kind = event.get("kind", "?")
    head = f"[dim]#{event.get('seq', '?'):<3}[/dim] "
    if event.get("inherited_from"):
        head += "[dim]↰[/dim] "  # the parent's entry, as the fork's log holds it
    if kind in _ONE_LINE:
        # A line of its own: no thought, no usage.
        return _ONE_LINE[kind](head, event)
    body: list[RenderableType] = []
    thought = event.get("thought") if event.get("source") == "AGENT" and kind != "message" else ""
    if thought:
        body.append(_para(thought, "italic dim"))
    what, more = _BY_KIND.get(kind, _other)(event)
    head += what + _usage(event)
    body += more
    return Group(Text.from_markup(head), *body) if body else Text.from_markup(head)


def _message(event: dict[str, Any]) -> _Shown:
    who = (
        "[bold blue]you[/bold blue]"
        if event.get("source") == "USER"
        else "[bold magenta]agent[/bold magenta]"
    )
    asks = " asks" if event.get("wait_for_response") else ""
    return f"{who}{asks}", [_para(event.get("content", ""))]


def _run(event: dict[str, Any]) -> _Shown:
    what = "[bold]runs[/bold]" if not event.get("is_input") else "[bold]types[/bold]"
    return what, [_terminal("", prompt=event.get("command", ""))]


def _output(event: dict[str, Any]) -> _Shown:
    """A command's, a Python cell's or a read's output."""
    code = event.get("exit_code")
    status = "" if code in (None, 0) else f" [red]exit {code}[/red]"
    if event.get("timed_out"):
        status += " [yellow]timed out[/yellow]"
    where = f" {escape(event.get('path', ''))}" if event.get("kind") == "read_output" else ""
    body: list[RenderableType] = [
        _terminal(event.get("content", ""), style="red" if status else "")
    ]
    if event.get("content_ref"):
        ref = event["content_ref"]
        body.append(
            _para(f"(cut; the whole output, {ref['size']} bytes, is blob {ref['sha256']})", "dim")
        )
    return f"[dim]output{where}[/dim]{status}", body


def _run_python(event: dict[str, Any]) -> _Shown:
    return "[bold]runs Python[/bold]", [_terminal(event.get("code", ""))]


def _read(event: dict[str, Any]) -> _Shown:
    return f"[bold]reads[/bold] {escape(event.get('path', ''))}", []


def _write(event: dict[str, Any]) -> _Shown:
    what = f"[bold]writes[/bold] {escape(event.get('path', ''))}"
    if event.get("content_ref"):
        return what, [
            _para(f"({event['content_ref']['size']} bytes, kept in the blob store)", "dim")
        ]
    return what, [_new_file_diff(event.get("path", ""), event.get("content", ""))]


def _write_output(event: dict[str, Any]) -> _Shown:
    return f"[dim]wrote {escape(event.get('path', ''))}[/dim]", []


def _edit(event: dict[str, Any]) -> _Shown:
    command = event.get("command", "")
    what = f"[bold]edits[/bold] {escape(event.get('path', ''))} [dim]({command})[/dim]"
    # The outcome (edit_output) shows the real diff; the action only a new file's content.
    if command == "create":
        return what, [_new_file_diff(event.get("path", ""), event.get("file_text") or "")]
    return what, []


def _edit_output(event: dict[str, Any]) -> _Shown:
    body = _diff(event["diff"]) if event.get("diff") else _terminal(event.get("content", ""))
    return f"[dim]edited {escape(event.get('path', ''))}[/dim]", [body]


def _mcp_call(event: dict[str, Any]) -> _Shown:
    what = (
        f"[bold]calls[/bold] {escape(event.get('tool', ''))} "
        f"[dim](MCP server {escape(event.get('server', ''))})[/dim]"
    )
    return what, [_terminal(json.dumps(event.get("arguments") or {}, indent=2))]


def _mcp_output(event: dict[str, Any]) -> _Shown:
    failed = " [red]error[/red]" if event.get("is_error") else ""
    what = f"[dim]{escape(event.get('tool', ''))} answered[/dim]{failed}"
    return what, [_terminal(event.get("content", ""), style="red" if failed else "")]


def _think(event: dict[str, Any]) -> _Shown:
    return "[dim]thinks[/dim]", []


def _finish(event: dict[str, Any]) -> _Shown:
    return "[bold green]finished[/bold green]", [_para(event.get("final_message", ""))]


def _error(event: dict[str, Any]) -> _Shown:
    what = f"[bold red]error[/bold red] [dim]{escape(event.get('error_code', ''))}[/dim]"
    return what, [_para(event.get("content", ""), "red")]


def _security_verdict(event: dict[str, Any]) -> _Shown:
    style = "green" if event.get("verdict") == "ALLOW" else "bold red"
    rule = f" ({escape(event['rule'])})" if event.get("rule") else ""
    reason = f": {escape(event['reason'])}" if event.get("reason") else ""
    what = (
        f"[dim]security[/dim] [{style}]{event.get('verdict')}[/{style}] "
        f"[dim]risk {event.get('risk')}{rule}{reason}[/dim]"
    )
    return what, []


def _delegate(event: dict[str, Any]) -> _Shown:
    limit = f", at most {event['max_iterations']} iterations" if event.get("max_iterations") else ""
    what = f"[bold magenta]delegates a sub-task[/bold magenta][dim]{limit}[/dim]"
    return what, [_para(event.get("task", ""))]


def _user_rejected(event: dict[str, Any]) -> _Shown:
    return "[red]rejected by you[/red]", []


def _task_created(event: dict[str, Any]) -> _Shown:
    budget = f", budget {money(event['max_budget_usd'])}" if event.get("max_budget_usd") else ""
    confirm = (
        f", confirmation from {event.get('confirmation_threshold')} risk"
        if event.get("confirmation_mode")
        else ""
    )
    limits = f"at most {event.get('max_iterations')} iterations{budget}{confirm}"
    if event.get("forked_from"):
        limits += f"; a fork of {event['forked_from']} at #{event.get('forked_at')}"
    return f"[dim]task created: {limits}[/dim]", []


def _rewind(event: dict[str, Any]) -> _Shown:
    back = event.get("rewound_to")
    if back is None:
        return f"[dim]rewind to #{event.get('to')} asked[/dim]", []
    return f"[bold]rewound to #{back}[/bold] [dim](what came after is out of its course)[/dim]", []


def _change_agent_state(event: dict[str, Any]) -> _Shown:
    return f"[dim]asks for {event.get('agent_state')}[/dim]", []


def _sandbox_queued(event: dict[str, Any]) -> _Shown:
    return f"[yellow]waits for a sandbox: place {event.get('position')}[/yellow]", []


def _connection(c: dict[str, Any]) -> str:
    where = escape(f"{c.get('host')}:{c.get('port')}")
    if not c.get("allowed"):
        return f"[red]{where} refused ({escape(str(c.get('reason')))})[/red]"
    added = f" (added {escape(', '.join(c['secrets']))})" if c.get("secrets") else ""
    return f"{where} {c.get('bytes_out', 0)} B out, {c.get('bytes_in', 0)} B in{added}"


def _egress_activity(event: dict[str, Any]) -> _Shown:
    connections = event.get("connections") or []
    more = f", and {event['more']} more" if event.get("more") else ""
    shown = "; ".join(_connection(c) for c in connections)
    return f"[dim]network:[/dim] {shown}{more}", []


def _workspace_checkpoint(event: dict[str, Any]) -> _Shown:
    at = event.get("action_seq")
    if event.get("skipped"):
        why = escape(str(event.get("detail") or event["skipped"]))
        return f"[yellow]no checkpoint of #{at}:[/yellow] [dim]{why}[/dim]", []
    stored = _bytes(int(event.get("stored_bytes") or 0))
    return (
        f"[dim]checkpoint of #{at}: {event.get('files')} paths, {event.get('changed')} "
        f"changed, {stored} stored[/dim]",
        [],
    )


def _loop_hint(event: dict[str, Any]) -> _Shown:
    return (
        f"[yellow]loop hint {event.get('hints_given')}:[/yellow] {escape(str(event.get('hint')))}",
        [],
    )


def _glob(event: dict[str, Any]) -> _Shown:
    where = f" in {escape(event['path'])}" if event.get("path") else ""
    return f"[bold]finds files[/bold] {escape(event.get('pattern', ''))}{where}", []


def _grep(event: dict[str, Any]) -> _Shown:
    where = f" in {escape(event['include'])}" if event.get("include") else ""
    where += f" under {escape(event['path'])}" if event.get("path") else ""
    return f"[bold]searches[/bold] {escape(event.get('pattern', ''))}{where}", []


def _apply_patch(event: dict[str, Any]) -> _Shown:
    return "[bold]applies a patch[/bold]", [_diff(event.get("patch", ""))]


_PLAN_MARKS = {"todo": "[ ]", "in_progress": "[~]", "done": "[x]"}


def plan_lines(tasks: list[dict[str, Any]]) -> list[str]:
    """The agent's plan, one line per task (also `deckhands show`)."""
    return [
        f"{n}. {_PLAN_MARKS.get(t.get('status', 'todo'), '[ ]')} {t.get('title', '')}"
        + (f" ({t['notes']})" if t.get("notes") else "")
        for n, t in enumerate(tasks, 1)
    ]


def _task_tracker(event: dict[str, Any]) -> _Shown:
    if event.get("command") == "view":
        return "[dim]looks at its plan[/dim]", []
    lines = plan_lines(event.get("tasks") or []) or ["(empty)"]
    return "[bold]plans[/bold]", [_para("\n".join(lines))]


def _workspace_uploaded(event: dict[str, Any]) -> _Shown:
    where = "/workspace" + (f"/{event['path']}" if event.get("path") else "")
    return (
        f"uploaded {event.get('files')} file(s) into {escape(where)} ({event.get('format')})",
        [],
    )


def _bytes(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    scaled = float(size)
    for unit in ("KiB", "MiB", "GiB"):
        scaled /= 1024
        if scaled < 1024 or unit == "GiB":
            break
    return f"{scaled:.1f} {unit}"


def _condensation(event: dict[str, Any]) -> _Shown:
    return f"[dim]history condensed up to #{event.get('forgotten_up_to_seq')}[/dim]", []


def _other(event: dict[str, Any]) -> _Shown:
    """A kind this command does not know (a newer gateway's): its name."""
    return f"[dim]{escape(event.get('kind', '?'))}[/dim]", []


def _state_changed(head: str, event: dict[str, Any]) -> RenderableType:
    before = event.get("previous_state") or "-"
    line = Text.from_markup(head + f"[dim]{before} ->[/dim] ")
    line.append_text(state_text(event.get("agent_state", "")))
    if event.get("reason"):
        line.append(f"  {event['reason']}", style="dim")
    return line


def _delegate_output(head: str, event: dict[str, Any]) -> RenderableType:
    sub_task = escape(event.get("sub_task_id", ""))
    line = Text.from_markup(head + f"[magenta]sub-task {sub_task} ended[/magenta] ")
    line.append_text(state_text(event.get("agent_state", "")))
    parts: list[RenderableType] = [line]
    if event.get("content"):
        parts.append(_para(event["content"]))
    return Group(*parts)


_BY_KIND: dict[str, Callable[[dict[str, Any]], _Shown]] = {
    "message": _message,
    "run": _run,
    "run_output": _output,
    "python_output": _output,
    "read_output": _output,
    "run_python": _run_python,
    "read": _read,
    "write": _write,
    "write_output": _write_output,
    "edit": _edit,
    "edit_output": _edit_output,
    "mcp_call": _mcp_call,
    "mcp_output": _mcp_output,
    "think": _think,
    "finish": _finish,
    "error": _error,
    "security_verdict": _security_verdict,
    "delegate": _delegate,
    "user_rejected": _user_rejected,
    "change_agent_state": _change_agent_state,
    "task_created": _task_created,
    "rewind": _rewind,
    "sandbox_queued": _sandbox_queued,
    "egress_activity": _egress_activity,
    "workspace_checkpoint": _workspace_checkpoint,
    "workspace_uploaded": _workspace_uploaded,
    "glob": _glob,
    "grep": _grep,
    "apply_patch": _apply_patch,
    "task_tracker": _task_tracker,
    "loop_hint": _loop_hint,
    "condensation": _condensation,
}
# Kinds that are one line (with what follows it) of their own, heading included.
_ONE_LINE: dict[str, Callable[[str, dict[str, Any]], RenderableType]] = {
    "agent_state_changed": _state_changed,
    "delegate_output": _delegate_output,
}
