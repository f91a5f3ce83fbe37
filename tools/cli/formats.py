"""How the `deckhands` command writes values (Rich): a state in its colour, money, an age, a
long output cut to its first and last lines, a diff coloured line by line."""

from __future__ import annotations

from datetime import UTC, datetime

from rich.text import Text

__all__ = ["OUTPUT_LINES", "age", "bounded", "diff_renderable", "diff_style", "money", "state_text"]

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


def diff_style(line: str) -> str:
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
        body.append(line, style=diff_style(line))
    return body
