"""Where an edit's old_str nearly is: the text a str_replace that found nothing most likely
meant, so that the agent can copy it exactly. A small model reads `return a - b` and sends
`-b`, or loses an indentation, then repeats the same edit until it is stopped; shown the
lines it meant, it copies them (Aider answers a failed edit the same way)."""

from __future__ import annotations

import difflib

_MAX_LINES = 20  # of the text shown
_MAX_CHARS = 2000
_MAX_SCANNED = 5000  # lines compared one by one, for the similarity search
_SIMILAR = 0.6


__all__ = ["near_miss"]


def near_miss(text: str, old_str: str) -> str:
    """A sentence naming the lines of `text` that `old_str` most likely meant, with them;
    "" when nothing is close."""
    lines = text.splitlines()
    found = _ignoring_whitespace(text, old_str)
    if found is not None:
        first, last = found
        return _shown(lines, first, last, "The file has it with other spacing")
    found = _most_similar(lines, old_str)
    if found is not None:
        first, last = found
        return _shown(lines, first, last, "The most similar text in the file is")
    return ""


def _ignoring_whitespace(text: str, old_str: str) -> tuple[int, int] | None:
    """The first and last line (0-based) of the first place `old_str` is in `text` once
    every space, tab and line break is taken out of both."""
    wanted = "".join(old_str.split())
    if not wanted:
        return None
    kept: list[str] = []
    line_of: list[int] = []
    line = 0
    for char in text:
        if char == "\n":
            line += 1
        elif not char.isspace():
            kept.append(char)
            line_of.append(line)
    at = "".join(kept).find(wanted)
    if at < 0:
        return None
    return line_of[at], line_of[at + len(wanted) - 1]


def _most_similar(lines: list[str], old_str: str) -> tuple[int, int] | None:
    """The run of as many lines as `old_str` has that is most like it, if alike enough."""
    size = max(1, len(old_str.strip("\n").splitlines()))
    wanted = old_str.strip("\n")
    best, best_at = 0.0, -1
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(wanted)
    for at in range(min(len(lines), _MAX_SCANNED) - size + 1):
        matcher.set_seq1("\n".join(lines[at : at + size]))
        if matcher.real_quick_ratio() <= best or matcher.quick_ratio() <= best:
            continue
        ratio = matcher.ratio()
        if ratio > best:
            best, best_at = ratio, at
    if best < _SIMILAR:
        return None
    return best_at, best_at + size - 1


def _shown(lines: list[str], first: int, last: int, what: str) -> str:
    where = f"line {first + 1}" if first == last else f"lines {first + 1}-{last + 1}"
    body = "\n".join(lines[first : min(last + 1, first + _MAX_LINES)])[:_MAX_CHARS]
    return (
        f"{what} at {where}:\n{body}\n"
        "Copy old_str exactly from the file, with its spaces and indentation."
    )
