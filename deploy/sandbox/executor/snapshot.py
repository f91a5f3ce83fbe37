"""The `scan`, `pack` and `commit` operations: what changed in /workspace since the last
checkpoint, and the bytes of the files the runtime does not hold yet (issue 28).

The executor remembers the workspace as the runtime last stored it (`committed`: each path's
type, mode, size, times, inode and content hash). A `scan` walks the workspace, hashes only the
files whose stat changed, and keeps the result pending; the runtime reads its changes in pages,
fetches the bytes it lacks with `pack`, stores them, then `commit`s the scan, which becomes
the new base. A runtime that dies between scan and commit leaves the base as it was: the next
scan reports the same changes again, nothing is skipped. `full` reports every path (the runtime
lost its copy of the base), with the hashes of unchanged files reused, not recomputed.

Only regular files, directories and symbolic links are kept; the runtime's own folder
(`.deckhands`, an uploaded tree's baseline) is left out, as are names that are not UTF-8 and
files the sandbox user cannot read (counted in `skipped`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import threading

from .config import WORKSPACE, Fail

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    from shared.sandbox_protocol.messages import (
        CommitReply,
        CommitRequest,
        PackPiece,
        PackReply,
        PackRequest,
        ScanEntry,
        ScanReply,
        ScanRequest,
    )

    Kind = Literal["f", "d", "l"]
    # path -> (type, mode, size, mtime_ns, ctime_ns, inode, sha256 hex or link target or "")
    Known = dict[str, tuple[Kind, int, int, int, int, int, str]]

OWN_FOLDER = ".deckhands"
PAGE_ENTRIES = 5000  # entries per scan reply: well below the runtime's line limit
PACK_MAX_BYTES = 2 << 20  # raw bytes per pack reply (base64 makes it 4/3 of that)
_READ = 1 << 20


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
# A file is opened without waiting (a fifo put in its place would block the open for ever) and
# without following a link; it is read only if it is then a regular file.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def open_beneath(root: int, rel: str, flags: int) -> int:
    """Open `rel` under the folder `root` one component at a time, following no link at any
    of them: the agent may swap a folder for a link to /proc/self (the executor's own) or
    anywhere else between a scan and a read, and nothing outside /workspace may be read."""
    parts = [p for p in rel.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise OSError(f"{rel!r} is no path inside the workspace")
    fd = os.dup(root)
    try:
        for part in parts[:-1]:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        return os.open(parts[-1], flags, dir_fd=fd)
    finally:
        os.close(fd)


def _read_key(fd: int, name: str, kind: str) -> str | None:
    """A file's SHA-256 or a link's target, read relative to its folder; None if unreadable."""
    try:
        if kind == "l":
            return os.readlink(name, dir_fd=fd)
        digest = hashlib.sha256()
        with open(os.open(name, _FILE_FLAGS, dir_fd=fd), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            while chunk := f.read(_READ):
                digest.update(chunk)
        return digest.hexdigest()
    except OSError:
        return None


class Snapshots:
    def __init__(self, root: str = WORKSPACE) -> None:
        self.root = root
        self.committed: Known = {}
        self.pending: tuple[str, Known, list[ScanEntry], list[str]] | None = None
        self._ids = 0
        self._lock = threading.Lock()

    # -- scan

    def scan(self, req: ScanRequest) -> ScanReply:
        with self._lock:
            wanted = req.get("scan")
            if wanted:  # the next page of the pending scan
                if self.pending is None or self.pending[0] != wanted:
                    raise Fail("not_found", f"no pending scan {wanted!r}")
                return self._page(int(req.get("start") or 0), files=0, size=0, skipped=0)
            max_files = int(req.get("max_files") or 0)
            max_bytes = int(req.get("max_bytes") or 0)
            found, count, skipped, size = self._walk(max_files, max_bytes)
            if found is None:
                self.pending = None
                return _too_large(count, size, skipped)
            full = bool(req.get("full"))
            changed: list[ScanEntry] = []
            for path, now in found.items():
                before = self.committed.get(path)
                if not full and before == now:
                    continue
                changed.append({"p": path, "t": now[0], "m": now[1], "s": now[2], "h": now[6]})
            deleted = [] if full else [p for p in self.committed if p not in found]
            self._ids += 1
            self.pending = (str(self._ids), found, changed, deleted)
            return self._page(0, files=len(found), size=size, skipped=skipped)

    def _page(self, start: int, files: int, size: int, skipped: int) -> ScanReply:
        assert self.pending is not None
        scan_id, _, changed, deleted = self.pending
        end = start + PAGE_ENTRIES
        return {
            "ok": True,
            "scan": scan_id,
            "changed": changed[start:end],
            "deleted": deleted if start == 0 else [],
            "more": end < len(changed),
            "total": len(changed),
            "files": files,
            "bytes": size,
            "skipped": skipped,
            "too_large": False,
        }

    def _walk(self, max_files: int, max_bytes: int) -> tuple[Known | None, int, int, int]:
        """Every kept path's stat (hashing files whose stat changed), or None past a bound.

        Every look-up is relative to a folder of the workspace opened here: a path from `/`
        crosses the container's root file system, which an engine on fuse-overlayfs answers
        at about 90 us a look-up (30 times a tmpfs stat), so 2,000 files took 200 ms."""
        found: Known = {}
        skipped = size = 0
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            stack = [""]
            while stack:
                rel_dir = stack.pop()
                try:
                    fd = open_beneath(root, rel_dir, _DIR_FLAGS) if rel_dir else os.dup(root)
                except OSError:
                    skipped += 1
                    continue
                try:
                    for name, st, content in self._entries(fd, rel_dir):
                        rel = name if not rel_dir else f"{rel_dir}/{name}"
                        if st is None:
                            skipped += 1
                            continue
                        key = _key(st)
                        if key is None:
                            skipped += 1  # a fifo, socket or device: nothing to keep
                            continue
                        kind, mode = key
                        now = (kind, mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                        before = self.committed.get(rel)
                        if kind == "d":
                            stack.append(rel)
                        elif before is not None and before[:6] == now:
                            content = before[6]
                        else:
                            read = _read_key(fd, name, kind)
                            if read is None:
                                skipped += 1
                                continue
                            content = read
                        if kind == "f":
                            size += st.st_size
                        found[rel] = (*now, content)
                        if (max_files and len(found) > max_files) or (
                            max_bytes and size > max_bytes
                        ):
                            return None, len(found), skipped, size
                finally:
                    os.close(fd)
        finally:
            os.close(root)
        return found, len(found), skipped, size

    def _entries(self, fd: int, rel_dir: str) -> list[tuple[str, os.stat_result | None, str]]:
        """A folder's entries (but the runtime's own) and their stat (None: unreadable)."""
        listed: list[tuple[str, os.stat_result | None, str]] = []
        try:
            names = os.listdir(fd)
        except OSError:
            return listed
        for name in names:
            if not rel_dir and name == OWN_FOLDER:
                continue
            try:
                name.encode("utf-8")
                listed.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False), ""))
            except (OSError, UnicodeEncodeError):
                listed.append((name, None, ""))
        return listed

    # -- pack

    def pack(self, req: PackRequest) -> PackReply:
        """The bytes of `files` from `start` in the first, up to `max_bytes` in all."""
        files = [str(p) for p in req.get("files") or []]
        offset = max(0, int(req.get("start") or 0))
        budget = min(max(1, int(req.get("max_bytes") or PACK_MAX_BYTES)), PACK_MAX_BYTES)
        data = bytearray()
        pieces: list[PackPiece] = []
        for rel in files:
            _inside(self.root, rel)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._pack(root, files, offset, budget, data, pieces)
        finally:
            os.close(root)
        return {"ok": True, "data": base64.b64encode(bytes(data)).decode(), "pieces": pieces}

    @staticmethod
    def _pack(
        root: int,
        files: list[str],
        offset: int,
        budget: int,
        data: bytearray,
        pieces: list[PackPiece],
    ) -> None:
        for index, rel in enumerate(files):
            if len(data) >= budget:
                break
            try:
                # Not through a link the agent put there since the scan: only what was a file.
                fd = open_beneath(root, rel, _FILE_FLAGS)
                with open(fd, "rb", buffering=0) as f:
                    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                        raise OSError("not a regular file")
                    f.seek(offset)
                    piece = f.read(budget - len(data) + 1)
            except OSError as exc:
                pieces.append({"i": index, "n": 0, "end": True, "error": str(exc)[:200]})
                offset = 0
                continue
            end = len(piece) <= budget - len(data)
            if not end:
                piece = piece[: budget - len(data)]
            data += piece
            pieces.append({"i": index, "n": len(piece), "end": end})
            offset = 0

    # -- commit

    def commit(self, req: CommitRequest) -> CommitReply:
        with self._lock:
            wanted = str(req.get("scan") or "")
            if self.pending is None or self.pending[0] != wanted:
                raise Fail("not_found", f"no pending scan {wanted!r}")
            self.committed = self.pending[1]
            self.pending = None
        return {"ok": True}


def _key(st: os.stat_result) -> tuple[Kind, int] | None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISREG(st.st_mode):
        return "f", mode
    if stat.S_ISDIR(st.st_mode):
        return "d", mode
    if stat.S_ISLNK(st.st_mode):
        return "l", mode
    return None


def _inside(root: str, rel: str) -> str:
    path = os.path.normpath(os.path.join(root, rel))
    if not path.startswith(root.rstrip("/") + "/"):
        raise Fail("bad_request", f"{rel!r} is not inside the workspace")
    return path


def _too_large(files: int, size: int, skipped: int) -> ScanReply:
    return {
        "ok": True,
        "scan": "",
        "changed": [],
        "deleted": [],
        "more": False,
        "total": 0,
        "files": files,
        "bytes": size,
        "skipped": skipped,
        "too_large": True,
    }
