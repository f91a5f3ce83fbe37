"""The `read`, `write`, `edit` and `chunk` operations: files, as the sandbox user."""

from __future__ import annotations

import errno
import os
import re
import stat

from .config import (
    CHUNK_BYTES,
    DEFAULT_LIMIT,
    KEPT_DIR,
    KEPT_NAMES,
    READ_MAX_BYTES,
    WORKSPACE,
    Fail,
)
from .loose_edit import loose_replacement
from .near_miss import near_miss
from .output import cut_middle, keep_whole, space_note, unlink_kept, whole_characters

TYPE_CHECKING = False
if TYPE_CHECKING:
    from shared.sandbox_protocol.messages import (
        ChunkReply,
        ChunkRequest,
        EditReply,
        EditRequest,
        ReadReply,
        ReadRequest,
        WriteReply,
        WriteRequest,
    )


class Files:
    """Reading, writing and editing files as the sandbox user (the kernel enforces access)."""

    def __init__(self) -> None:
        self.history: dict[str, list[str | None]] = {}

    def read(self, req: ReadRequest) -> ReadReply:
        path = _resolve(str(req.get("path", "")))
        text = _read_text(path)
        lines = text.splitlines(True)
        start = int(req.get("start_line") or 1)
        end = req.get("end_line")
        stop = len(lines) if end is None else min(int(end), len(lines))
        if start > max(len(lines), 1):
            raise Fail(
                "bad_range", f"{path} has {len(lines)} lines; start_line {start} is past the end"
            )
        if end is not None and int(end) < start:
            raise Fail("bad_range", f"end_line {end} is before start_line {start}")
        content = "".join(lines[start - 1 : stop])
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        return {
            "ok": True,
            "path": path,
            "content": cut_middle("", 0, content, limit),
            "total_lines": len(lines),
            **keep_whole("read.out", content, limit, int(req.get("keep") or 0)),
        }

    def chunk(self, req: ChunkRequest) -> ChunkReply:
        """A piece of a kept file, from byte `offset`, ending on a UTF-8 character boundary."""
        name = str(req.get("name", ""))
        if name not in KEPT_NAMES:
            raise Fail("bad_request", f"no kept output is called {name!r}")
        offset = max(0, int(req.get("offset") or 0))
        size = min(max(4, int(req.get("size") or CHUNK_BYTES)), CHUNK_BYTES)
        path = os.path.join(KEPT_DIR, name)
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(size + 1)
        except FileNotFoundError:
            raise Fail("not_found", f"the kept output {name!r} is gone") from None
        eof = len(data) <= size
        data = data[:size]
        if not eof:
            data = data[: whole_characters(data)]
        if eof and req.get("drop"):
            unlink_kept(name)
        return {
            "ok": True,
            "data": data.decode("utf-8", "replace"),
            "next": offset + len(data),
            "eof": eof,
        }

    def write(self, req: WriteRequest) -> WriteReply:
        path = _resolve(str(req.get("path", "")))
        content = str(req.get("content", ""))
        self._remember(path)
        data = content.encode()
        reply: WriteReply = {"ok": True, "path": path, "size": len(data)}
        previous = _previous_bytes(path)
        _write_text(path, content)
        if previous is not None:
            # The agent learns it wrote over a file (one it may never have read), or that the
            # write changed nothing: a small model rewrote the same file again and again.
            reply["previous_size"] = len(previous)
            reply["unchanged"] = previous == data
        return reply

    # -- the OpenHands editor's commands

    def edit(self, req: EditRequest) -> EditReply:
        command = str(req.get("command", ""))
        path = _resolve(str(req.get("path", "")))
        limit = int(req.get("limit") or DEFAULT_LIMIT)
        if command == "view":
            return self._view(path, req, limit)
        if command == "create":
            if os.path.exists(path):
                raise Fail("file_exists", f"{path} already exists; use str_replace or write")
            new = str(req.get("file_text") or "")
            self._remember(path)
            _write_text(path, new)
            return self._edited(path, "", new, f"Created {path}", limit)
        if command == "str_replace":
            return self._str_replace(path, req, limit)
        if command == "insert":
            return self._insert(path, req, limit)
        if command == "undo":
            return self._undo(path, limit)
        raise Fail(
            "bad_request",
            f"unknown edit command {command!r}; use view, create, str_replace, insert or undo",
        )

    def _view(self, path: str, req: EditRequest, limit: int) -> EditReply:
        if os.path.isdir(path):
            entries: list[str] = []
            for root, dirs, files in os.walk(path):
                depth = root[len(path) :].count(os.sep)
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                if depth >= 2:
                    dirs[:] = []
                entries.extend(os.path.join(root, d) + "/" for d in dirs)
                entries.extend(
                    os.path.join(root, f) for f in sorted(files) if not f.startswith(".")
                )
            listing = "\n".join(sorted(entries))
            return {
                "ok": True,
                "path": path,
                "content": cut_middle("", 0, listing, limit),
                "diff": "",
            }
        text = _read_text(path)
        lines = text.splitlines()
        rng = req.get("view_range") or [1, -1]
        start, end = int(rng[0]), int(rng[1])
        end = len(lines) if end == -1 else min(end, len(lines))
        if start < 1 or (lines and start > len(lines)) or end < start - 1:
            raise Fail("bad_range", f"view_range {rng} is outside 1..{len(lines)}")
        numbered = "\n".join(f"{i:6}\t{lines[i - 1]}" for i in range(start, end + 1))
        return {"ok": True, "path": path, "content": cut_middle("", 0, numbered, limit), "diff": ""}

    def _str_replace(self, path: str, req: EditRequest, limit: int) -> EditReply:
        old_str = req.get("old_str")
        if not old_str:
            raise Fail("bad_request", "str_replace needs a non-empty old_str")
        new_str = str(req.get("new_str") or "")
        old = _read_text(path)
        count = old.count(old_str)
        if count == 0:
            loose = loose_replacement(old, old_str, new_str)
            if loose is not None:
                # One place matches once spaces are ignored (loose_edit.py).
                new, line = loose
                self._remember(path)
                _write_text(path, new)
                said = f"Edited {path}: old_str was not in it as written; line {line} is, once "
                said += "spaces are ignored, and that is what was replaced"
                return self._edited(path, old, new, said, limit)
            hint = near_miss(old, old_str)
            message = f"old_str was not found in {path}; nothing was changed"
            raise Fail("no_match", f"{message}. {hint}" if hint else message)
        if count > 1:
            at = [old.count("\n", 0, m.start()) + 1 for m in re.finditer(re.escape(old_str), old)]
            raise Fail(
                "multiple_matches",
                f"old_str occurs {count} times in {path} (lines "
                f"{', '.join(map(str, at[:20]))}); make it unique. Nothing changed",
            )
        new = old.replace(old_str, new_str, 1)
        self._remember(path)
        _write_text(path, new)
        return self._edited(path, old, new, f"Edited {path}", limit)

    def _insert(self, path: str, req: EditRequest, limit: int) -> EditReply:
        line = req.get("insert_line")
        if line is None:
            raise Fail("bad_request", "insert needs insert_line (0 inserts at the top)")
        old = _read_text(path)
        lines = old.splitlines(True)
        n = int(line)
        if n < 0 or n > len(lines):
            raise Fail("bad_range", f"insert_line {n} is outside 0..{len(lines)}")
        text = str(req.get("new_str") or "")
        if text and not text.endswith("\n"):
            text += "\n"
        if n > 0 and lines and not lines[n - 1].endswith("\n"):
            lines[n - 1] += "\n"
        new = "".join([*lines[:n], text, *lines[n:]])
        self._remember(path)
        _write_text(path, new)
        return self._edited(path, old, new, f"Inserted into {path} after line {n}", limit)

    def _undo(self, path: str, limit: int) -> EditReply:
        stack = self.history.get(path)
        if not stack:
            raise Fail("nothing_to_undo", f"no edit of {path} to undo")
        previous = stack.pop()
        current = _read_text(path) if os.path.exists(path) else ""
        if previous is None:
            os.unlink(path)
            return self._edited(path, current, "", f"Undid the creation of {path}", limit)
        _write_text(path, previous)
        return self._edited(path, current, previous, f"Undid the last edit of {path}", limit)

    def _remember(self, path: str) -> None:
        previous = _read_text(path) if os.path.isfile(path) else None
        stack = self.history.setdefault(path, [])
        stack.append(previous)
        del stack[:-10]

    @staticmethod
    def _edited(path: str, old: str, new: str, message: str, limit: int) -> EditReply:
        import difflib

        diff = "".join(
            difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a{path}", f"b{path}")
        )
        return {
            "ok": True,
            "path": path,
            "content": message,
            "diff": cut_middle("", 0, diff, limit),
        }


def _resolve(path: str) -> str:
    if not path:
        raise Fail("bad_request", "path is empty")
    return os.path.normpath(path if os.path.isabs(path) else os.path.join(WORKSPACE, path))


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "special file"


def _open_regular(path: str, flags: int) -> int:
    """A descriptor of the regular file at `path`, or a clear Fail.

    Opened without blocking (a FIFO with no other end would wait for ever) and checked with
    fstat before a byte moves: devices, FIFOs and sockets are refused, never read or written.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except FileNotFoundError:
        raise Fail("file_not_found", f"{path} does not exist") from None
    except IsADirectoryError:
        raise Fail("is_a_directory", f"{path} is a directory") from None
    except PermissionError:
        raise Fail("permission_denied", f"permission denied: {path}") from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise Fail(
                "not_a_regular_file",
                f"{path} is a FIFO or socket, not a regular file; use a command for it",
            ) from None
        if exc.errno == errno.EROFS:
            raise Fail("permission_denied", f"read-only file system: {path}") from None
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        os.set_blocking(fd, True)
        return fd
    os.close(fd)
    if stat.S_ISDIR(mode):
        raise Fail("is_a_directory", f"{path} is a directory")
    raise Fail(
        "not_a_regular_file",
        f"{path} is a {_file_kind(mode)}, not a regular file; use a command for it",
    )


def _read_text(path: str) -> str:
    fd = _open_regular(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        data = f.read(READ_MAX_BYTES + 1)  # bounded even if the file grows meanwhile
    if len(data) > READ_MAX_BYTES:
        raise Fail(
            "file_too_large",
            f"{path} is larger than the {READ_MAX_BYTES:,} bytes a file operation reads; look "
            "at parts of it with a command (head, tail, sed -n 'A,Bp', grep)",
        )
    if b"\x00" in data[:8192]:
        raise Fail("binary_file", f"{path} looks like a binary file ({len(data)} bytes)")
    return data.decode("utf-8", "replace")


def _previous_bytes(path: str) -> bytes | None:
    """What the regular file at `path` holds before a write (bounded); None when there is no
    such file or it cannot be read (the write then says what is wrong)."""
    try:
        fd = _open_regular(path, os.O_RDONLY)
    except Fail:
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(READ_MAX_BYTES + 1)


def _write_text(path: str, content: str) -> None:
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
    except PermissionError:
        raise Fail("permission_denied", f"permission denied: {path}") from None
    except OSError as exc:
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None
    # Truncated only once it is known to be a regular file.
    fd = _open_regular(path, os.O_WRONLY | os.O_CREAT)
    try:
        with os.fdopen(fd, "wb") as f:
            f.truncate(0)
            f.write(content.encode("utf-8"))
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            note = space_note("No space left on device")
            raise Fail("no_space", f"{path}: no space left on the device {note}".strip()) from None
        raise Fail("io_error", f"{path}: {exc.strerror or exc}") from None
