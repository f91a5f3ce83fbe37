"""Output as the agent sees it: cut in the middle to a limit, and kept whole in a file when cut.

`bash`, `python` and `read` take `keep` (bytes). When the output is longer than `limit`, the
answer's `output`/`content` is still cut in the middle, and the whole of it, if it fits in
`keep`, is kept in a file under KEPT_DIR; the answer names it (`kept`, `kept_bytes`). The
runtime fetches it with `chunk` (Files.chunk). Each part keeps one file at a time.
"""

from __future__ import annotations

import contextlib
import os

from .config import KEPT_DIR

TYPE_CHECKING = False
if TYPE_CHECKING:
    import io
    from typing import TypedDict

    class Kept(TypedDict, total=False):
        """The `kept` and `kept_bytes` of a reply whose output was cut and is kept whole."""

        kept: str
        kept_bytes: int


# Kept beyond the limit while reading, so the tail survives until the end marker is seen.
_SLACK = 16_384


class Captured:
    """Output that is cut in the middle once it exceeds `limit`, without holding all of it.

    With `keep` > 0 the whole output also goes to a file (`kept_name` under KEPT_DIR) while it
    stays within `keep` bytes; `kept()` then names it when the output was cut.
    """

    def __init__(self, limit: int, keep: int = 0, kept_name: str = "") -> None:
        self.limit = max(1, limit)
        self.head = ""
        self.tail = ""
        self.dropped = 0
        self.keep = keep if kept_name else 0
        self.kept_name = kept_name
        self.kept_bytes = 0
        self._kept_file: io.BufferedWriter | None = None
        if self.keep:
            unlink_kept(kept_name)  # the part's previous output, fetched or abandoned

    def _keep(self, text: str) -> None:
        if not self.keep or not text:
            return
        data = text.encode("utf-8", "replace")
        try:
            if self._kept_file is None:
                os.makedirs(KEPT_DIR, mode=0o700, exist_ok=True)
                self._kept_file = open(os.path.join(KEPT_DIR, self.kept_name), "wb")
            if self.kept_bytes + len(data) > self.keep:
                raise OSError("longer than keep")
            self._kept_file.write(data)
            self.kept_bytes += len(data)
        except OSError:  # too long, or /tmp is full: the cut output is all there is
            self._stop_keeping()

    def _stop_keeping(self) -> None:
        if self._kept_file is not None:
            with contextlib.suppress(OSError):
                self._kept_file.close()
            self._kept_file = None
        self.keep = 0
        unlink_kept(self.kept_name)

    def trim_end(self, count: int) -> None:
        """Remove the last `count` characters (the shell's end marker and what follows it)."""
        if count <= 0:
            return
        removed = self.tail[-count:]
        self.tail = self.tail[:-count]
        if self._kept_file is not None:
            size = len(removed.encode("utf-8", "replace"))
            try:
                self._kept_file.flush()
                self.kept_bytes = max(0, self.kept_bytes - size)
                self._kept_file.truncate(self.kept_bytes)
                self._kept_file.seek(self.kept_bytes)
            except OSError:
                self._stop_keeping()

    def kept(self) -> Kept:
        """`{kept, kept_bytes}` when the output was cut and is kept whole; else nothing."""
        if self._kept_file is None:
            return {}
        try:
            self._kept_file.close()
        except OSError:
            self._kept_file = None
            self._stop_keeping()
            return {}
        self._kept_file = None
        if len(self.head) + self.dropped + len(self.tail) <= self.limit:
            unlink_kept(self.kept_name)  # not cut: the answer carries all of it
            return {}
        return {"kept": self.kept_name, "kept_bytes": self.kept_bytes}

    def add(self, text: str) -> None:
        self._keep(text)
        self.tail += text
        keep = self.limit - self.limit // 2 + _SLACK
        if len(self.tail) > keep + self.limit + _SLACK:
            if not self.head and not self.dropped:
                self.head = self.tail[: self.limit // 2]
                self.tail = self.tail[len(self.head) :]
            excess = len(self.tail) - keep
            if excess > 0:
                self.dropped += excess
                self.tail = self.tail[excess:]

    def render(self, tail: str | None = None) -> str:
        return cut_middle(self.head, self.dropped, self.tail if tail is None else tail, self.limit)


def keep_whole(name: str, text: str, limit: int, keep: int) -> Kept:
    """Keep `text` (already whole in memory) like Captured does, when it is longer than limit."""
    if keep <= 0 or len(text) <= limit:
        return {}
    out = Captured(limit, keep, name)
    out.head, out.dropped = "", len(text)  # counts as cut without holding it twice
    out._keep(text)
    return out.kept()


def cut_middle(head: str, dropped: int, tail: str, limit: int) -> str:
    total = len(head) + dropped + len(tail)
    if total <= limit:
        return head + tail
    half = limit // 2
    first = (head + tail)[:half] if not dropped else head[:half]
    last = tail[-(limit - half) :] if limit - half else ""
    cut = total - len(first) - len(last)
    return f"{first}\n\n[... {cut} characters cut from the middle of the output ...]\n\n{last}"


def whole_characters(data: bytes) -> int:
    """Length of `data` without a UTF-8 character cut at its end."""
    end = len(data)
    start = end - 1
    while start >= 0 and end - start < 4 and (data[start] & 0xC0) == 0x80:
        start -= 1  # continuation bytes: find the character's first byte
    if start < 0:
        return end
    lead = data[start]
    width = 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return start if start + width > end else end


def unlink_kept(name: str) -> None:
    unlink_quietly(os.path.join(KEPT_DIR, name))


def unlink_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def space_note(output: str) -> str:
    """space.py's note when the sandbox ran out of room (loaded on first use: start-up counts)."""
    from .space import space_note

    return space_note(output)
