"""How the `deckhands` command shows events and tasks (Rich): commands and their output as a
terminal would show them (bounded), file edits as diffs, delegation as a sentence; a task as a
line of a table, a status line or a whole view. One event's renderers are in events.py, the
way values are written in formats.py; both are exported from here."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from .events import event_renderable, plan_lines
from .formats import OUTPUT_LINES, age, bounded, diff_renderable, money, state_text

__all__ = [
    "OUTPUT_LINES",
    "age",
    "bounded",
    "diff_renderable",
    "event_renderable",
    "money",
    "status_line",
    "task_table",
    "task_view",
]


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
    if task.get("forked_from"):
        grid.add_row("forked from", f"{task['forked_from']} at seq {task.get('forked_at')}")
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
    if task.get("plan"):
        parts += [Text("\nplan:", style="bold"), Text("\n".join(plan_lines(task["plan"])))]
    if task.get("result"):
        parts += [Text("\nresult:", style="bold green"), Text(task["result"]["final_message"])]
    return Group(*parts)
