"""Archives in and out of a workspace: checked and rewritten, file by file, never whole in memory.

An upload (a tar, compressed or not, or a zip) is not handed to Docker as the client sent it:
it is read entry by entry and written again as a plain tar of what a workspace may receive:
directories, regular files and symbolic links, under relative paths that stay in /workspace,
owned by the sandbox user (1000), without setuid bits. Every directory on a file's way is
written as a directory entry before the file, so Docker's extraction replaces a symbolic link
found there (the agent may have made `/workspace/x -> /etc`) instead of writing through it.
Hard links, devices and FIFOs are refused, and so is an entry below a symbolic link of the same
archive. Sizes are counted as the bytes are copied (a zip bomb stops at the limit). The entries
are read by archive_entries.py, their paths checked by workspace_paths.py.

A download is Docker's tar of /workspace, gzipped as it streams, without the runtime's own
`.deckhands/` directory (the baseline of an uploaded tree): workspace_download.py.

Blocking (file I/O, compression): called on threads.
"""

from __future__ import annotations

import io
import tarfile
import time
from typing import IO, cast

from .archive_entries import EntryData, tar_entries, zip_entries
from .errors import ArchiveRefused, ArchiveTooLarge
from .workspace_download import ChunkReader, gzip_tree
from .workspace_paths import STATE_DIR, check_path, check_upload_path

__all__ = [
    "SANDBOX_UID",
    "STATE_DIR",
    "ChunkReader",
    "check_path",
    "check_upload_path",
    "clean_upload",
    "gzip_tree",
    "single_file_tar",
]

SANDBOX_UID = 1000


class _Writer:
    """Writes a clean tar: parent directories first, each once, sandbox-owned."""

    def __init__(self, out: IO[bytes], max_bytes: int, max_files: int) -> None:
        self.tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.bytes = 0
        self.files = 0
        self.dirs: set[str] = set()
        self.links: set[str] = set()

    def _info(self, name: str, kind: bytes, mode: int, mtime: float) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode & 0o777 & ~0o022 | (0o755 if kind == tarfile.DIRTYPE else 0o644)
        info.mode &= 0o777  # never setuid, setgid or sticky
        info.uid = info.gid = SANDBOX_UID
        info.uname = info.gname = "sandbox"
        info.mtime = int(mtime) if mtime > 0 else int(time.time())
        return info

    def _under_link(self, name: str) -> None:
        parts = name.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in self.links:
                raise ArchiveRefused(
                    f"{name!r} lies below a symbolic link of the same archive; refused"
                )

    def _parents(self, name: str, mtime: float) -> None:
        parts = name.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            self.directory("/".join(parts[:i]), 0o755, mtime)

    def _count(self) -> None:
        self.files += 1
        if self.files > self.max_files:
            raise ArchiveTooLarge(f"more than {self.max_files} entries")

    def directory(self, name: str, mode: int, mtime: float) -> None:
        if name in self.dirs:
            return
        self._under_link(name + "/x")
        self._parents(name, mtime)
        self._count()
        self.dirs.add(name)
        self.tar.addfile(self._info(name, tarfile.DIRTYPE, mode, mtime))

    def file(self, name: str, mode: int, mtime: float, size: int, data: IO[bytes]) -> None:
        self._under_link(name)
        self._parents(name, mtime)
        self._count()
        self.bytes += size
        if self.bytes > self.max_bytes:
            raise ArchiveTooLarge(f"more than {self.max_bytes} bytes once extracted")
        info = self._info(name, tarfile.REGTYPE, mode, mtime)
        info.size = size
        self.tar.addfile(info, _Exactly(data, size))

    def symlink(self, name: str, target: str, mtime: float) -> None:
        if not target or "\x00" in target:
            raise ArchiveRefused(f"the symbolic link {name!r} has no valid target")
        self._under_link(name)
        self._parents(name, mtime)
        self._count()
        info = self._info(name, tarfile.SYMTYPE, 0o777, mtime)
        info.linkname = target
        self.links.add(name)
        self.tar.addfile(info)

    def close(self) -> None:
        self.tar.close()


class _Exactly(io.RawIOBase):
    """Reads exactly `size` bytes of `data` (a zip member's size is only what it claims)."""

    def __init__(self, data: IO[bytes], size: int) -> None:
        self.data = data
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            return b""
        n = self.left if n < 0 else min(n, self.left)
        chunk = self.data.read(n)
        if not chunk:
            raise ArchiveRefused("an entry ended before its stated size")
        self.left -= len(chunk)
        return chunk


def _names_the_root(raw: str) -> bool:
    """`.`, `./` or `/workspace/`: the directory the archive unpacks into, which exists."""
    if raw == "/workspace" or raw.startswith("/workspace/"):
        raw = raw[len("/workspace") :]
    elif raw.startswith("/"):
        return False  # outside: check_path refuses it
    return not [p for p in raw.split("/") if p not in ("", ".")]


def _entry_name(raw: str, base: str | None) -> str:
    return check_upload_path(f"{base}/{check_path(raw)}" if base else raw)


def clean_upload(
    source: IO[bytes],
    archive: str,
    out: IO[bytes],
    *,
    max_bytes: int,
    max_files: int,
    base: str | None = None,
) -> int:
    """Rewrite the upload (`tar`, any compression tarfile reads, or `zip`) as a clean tar into
    `out`, its entries under `base` (a checked relative path) if given; the number of files and
    links written. ArchiveRefused / ArchiveTooLarge say why not."""
    writer = _Writer(out, max_bytes, max_files)
    written = 0
    entries = zip_entries(source) if archive == "zip" else tar_entries(source)
    try:
        for kind, raw_name, mode, mtime, size, raw_data, target in entries:
            data = None if raw_data is None else cast(IO[bytes], EntryData(raw_data, raw_name))
            if kind == "dir" and _names_the_root(raw_name):
                continue  # `tar -C dir .` opens with `./`: the workspace (or base) itself
            name = _entry_name(raw_name, base)
            if kind == "dir":
                writer.directory(name, mode, mtime)
            elif kind == "file":
                assert data is not None
                writer.file(name, mode, mtime, size, data)
                written += 1
            else:
                writer.symlink(name, target, mtime)
                written += 1
    finally:
        writer.close()  # refused too: its output is thrown away, but closed while `out` is open
    return written


def single_file_tar(name: str, source: IO[bytes], size: int, out: IO[bytes]) -> None:
    """A clean tar holding one file at `name` (checked) and its parent directories."""
    writer = _Writer(out, max_bytes=size, max_files=10_000)
    try:
        writer.file(check_upload_path(name), 0o644, time.time(), size, source)
    finally:
        writer.close()
