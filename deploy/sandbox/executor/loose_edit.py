"""A one-line edit whose old_str is off only in its spaces is made where it fits once.

A small model drops or adds spaces it read (it sent `-b` for `return a - b`) and repeats the
same edit until it is stopped. When one place, and only one, matches once spaces are ignored,
the edit is made there and the reply says so; anything less certain is an error that shows
the lines meant (near_miss.py)."""

from __future__ import annotations

__all__ = ["loose_replacement"]


def loose_replacement(text: str, old_str: str, new_str: str) -> tuple[str, int] | None:
    """`text` with a one-line `old_str` replaced where it is once when spaces are ignored, and
    that line's number; None unless both are one line and that place is one and only one.
    The indentation `old_str` and `new_str` share is not added twice."""
    if "\n" in old_str.strip("\n") or "\n" in new_str.strip("\n"):
        return None
    wanted = "".join(old_str.split())
    if len(wanted) < 2:
        return None
    kept, where = [], []
    for at, char in enumerate(text):
        if not char.isspace():
            kept.append(char)
            where.append(at)
    squeezed = "".join(kept)
    found = squeezed.find(wanted)
    if found < 0 or squeezed.find(wanted, found + 1) >= 0:
        return None
    start, end = where[found], where[found + len(wanted) - 1] + 1
    if "\n" in text[start:end]:
        return None
    line = old_str.strip("\n")
    lead = line[: len(line) - len(line.lstrip())]
    trail = line[len(line.rstrip()) :]
    new = new_str.strip("\n").removeprefix(lead)
    new = new.removesuffix(trail) if trail else new
    return text[:start] + new + text[end:], text.count("\n", 0, start) + 1
