"""Archives in and out of a workspace: checked and rewritten, file by file, never whole in memory.

An upload (a tar, compressed or not, or a zip) is not handed to Docker as the client sent it:
it is read entry by entry and written again as a plain tar of what a workspace may receive:
directories, regular files and symbolic links, under relative paths that stay in /workspace,
owned by the sandbox user (1000), without setuid bits. Every directory on a file's way is
written as a directory entry before the file, so Docker's extraction replaces a symbolic link
found there (the agent may have made `/workspace/x -> /etc`) instead of writing through it.
Hard links, devices and FIFOs are refused, and so is an entry below a symbolic link of the same
archive. Sizes are counted as the bytes are copied (a zip bomb stops at the limit).

A download is Docker's tar of /workspace, gzipped as it streams, without the runtime's own
`.deckhands/` directory (the baseline of an uploaded tree).

Blocking (file I/O, compression): called on threads.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import stat
import tarfile
import time
import zipfile
import zlib
from collections.abc import Iterator
from typing import IO, cast

from .errors import ArchiveRefused, ArchiveTooLarge

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
STATE_DIR = ".deckhands"  # the runtime's own files in a workspace (an uploaded tree's baseline)
# Linux's NAME_MAX, and PATH_MAX less "/workspace/"; the depth is far beyond any real tree's.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096 - len("/workspace/") - 1
MAX_PATH_DEPTH = 256
_COPY_CHUNK = 1 << 20


def check_path(path: str) -> str:
    """A path relative to /workspace, normalised; refused if it leaves it.

    `/workspace/x` and `x` name the same file; `..`, an absolute path elsewhere, an empty
    path and control characters are refused.
    """
    if not path or "\x00" in path or any(ord(c) < 32 for c in path):
        raise ArchiveRefused("the path is empty or holds control characters")
    if path == "/workspace" or path.startswith("/workspace/"):
        path = path[len("/workspace") :].lstrip("/")
    elif path.startswith("/"):
        raise ArchiveRefused(f"the path {path!r} is outside /workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise ArchiveRefused("the path names /workspace itself, not a file in it")
    if ".." in parts:
        raise ArchiveRefused(f"the path {path!r} leaves /workspace ('..' is refused)")
    # Past these the kernel would refuse it (ENAMETOOLONG) deep in Docker, slowly and in the
    # engine's words.
    if len(parts) > MAX_PATH_DEPTH:
        raise ArchiveRefused(
            f"the path is {len(parts)} levels deep, more than the limit of {MAX_PATH_DEPTH}"
        )
    longest = max(len(p.encode()) for p in parts)
    if longest > MAX_NAME_BYTES:
        raise ArchiveRefused(
            f"a name in the path is {longest} bytes long, more than the limit of {MAX_NAME_BYTES}"
        )
    joined = "/".join(parts)
    if len(joined.encode()) > MAX_PATH_BYTES:
        raise ArchiveRefused(
            f"the path is {len(joined.encode())} bytes long, more than the limit of "
            f"{MAX_PATH_BYTES}"
        )
    return joined


def check_upload_path(path: str) -> str:
    """check_path, and not in the runtime's own `.deckhands/` (an uploaded tree's baseline)."""
    name = check_path(path)
    if name.split("/", 1)[0] == STATE_DIR:
        raise ArchiveRefused(
            f"{path!r} is in {STATE_DIR}/, which is deckhands' own: an upload may not write it"
        )
    return name


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


# What reading a damaged or truncated archive raises, by format and compression: a decoder's
# error while an entry's data is read comes from inside tarfile or zipfile, past the checks
# that opened the archive.
_DAMAGE = (
    tarfile.TarError,
    zipfile.BadZipFile,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    OSError,  # bz2's and gzip's "invalid data stream", "Not a gzipped file"
    NotImplementedError,  # a zip's unsupported compression method
    RuntimeError,  # an encrypted zip entry
)


class _Damaged(io.RawIOBase):
    """An entry's data whose decoding errors say the archive is damaged (ArchiveRefused)."""

    def __init__(self, data: IO[bytes], name: str) -> None:
        self.data = data
        self.name = name

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        try:
            return self.data.read(n)
        except _DAMAGE as exc:
            raise ArchiveRefused(
                f"the archive is damaged: {self.name!r} cannot be read ({type(exc).__name__}: "
                f"{exc})"[:300]
            ) from None


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
    entries = _zip_entries(source) if archive == "zip" else _tar_entries(source)
    try:
        for kind, raw_name, mode, mtime, size, raw_data, target in entries:
            data = None if raw_data is None else cast(IO[bytes], _Damaged(raw_data, raw_name))
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


_Entry = tuple[str, str, int, float, int, IO[bytes] | None, str]


def _decompressed(source: IO[bytes]) -> IO[bytes]:
    """The upload, decompressed by the format's own reader: unlike tarfile's stream mode,
    gzip's checks its CRC-32 and length, so garbled data is refused rather than written."""
    head = source.read(6)
    source.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return cast(IO[bytes], gzip.GzipFile(fileobj=source, mode="rb"))
    if head.startswith(b"BZh"):
        return cast(IO[bytes], bz2.BZ2File(source, mode="rb"))
    if head.startswith(b"\xfd7zXZ\x00"):
        return cast(IO[bytes], lzma.LZMAFile(source, mode="rb"))
    return source


def _tar_entries(source: IO[bytes]) -> Iterator[_Entry]:
    source = _decompressed(source)
    try:
        tar = tarfile.open(fileobj=source, mode="r|")
    except _DAMAGE as exc:
        raise ArchiveRefused(f"not a tar archive: {exc}") from None
    try:
        for member in tar:
            if member.isdir():
                yield "dir", member.name, member.mode, member.mtime, 0, None, ""
            elif member.isreg():
                data = tar.extractfile(member)
                assert data is not None
                yield "file", member.name, member.mode, member.mtime, member.size, data, ""
            elif member.issym():
                yield "link", member.name, 0o777, member.mtime, 0, None, member.linkname
            elif member.islnk():
                raise ArchiveRefused(f"{member.name!r} is a hard link: not supported, refused")
            else:
                raise ArchiveRefused(
                    f"{member.name!r} is a device, FIFO or other special file: refused"
                )
        # The end of the compressed stream, where its checksum is (tarfile stops reading at
        # the archive's end marker). tar pads to its record size (10 KiB); more is not a tar's.
        trailing = 0
        while chunk := source.read(_COPY_CHUNK):
            trailing += len(chunk)
            if trailing > _COPY_CHUNK:
                raise ArchiveRefused("the tar archive has data past its end")
    except _DAMAGE as exc:
        raise ArchiveRefused(f"the tar archive is damaged: {type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(*_DAMAGE):
            tar.close()


def _zip_entries(source: IO[bytes]) -> Iterator[_Entry]:
    try:
        archive = zipfile.ZipFile(source)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ArchiveRefused(f"not a zip archive: {exc}") from None
    with archive:
        for item in archive.infolist():
            mtime = time.mktime((*item.date_time, 0, 0, -1))
            unix_mode = item.external_attr >> 16
            if item.is_dir():
                yield "dir", item.filename, unix_mode or 0o755, mtime, 0, None, ""
            elif stat.S_ISLNK(unix_mode):
                try:
                    with archive.open(item) as link:
                        target = link.read(4096).decode("utf-8", "replace")
                except _DAMAGE as exc:
                    raise ArchiveRefused(f"{item.filename!r} cannot be read: {exc}") from None
                yield "link", item.filename, 0o777, mtime, 0, None, target
            elif stat.S_IFMT(unix_mode) and not stat.S_ISREG(unix_mode):
                raise ArchiveRefused(f"{item.filename!r} is a special file: refused")
            else:
                try:
                    with archive.open(item) as data:
                        mode = unix_mode or 0o644
                        yield "file", item.filename, mode, mtime, item.file_size, data, ""
                except _DAMAGE as exc:
                    raise ArchiveRefused(f"{item.filename!r} cannot be read: {exc}") from None


def single_file_tar(name: str, source: IO[bytes], size: int, out: IO[bytes]) -> None:
    """A clean tar holding one file at `name` (checked) and its parent directories."""
    writer = _Writer(out, max_bytes=size, max_files=10_000)
    try:
        writer.file(check_upload_path(name), 0o644, time.time(), size, source)
    finally:
        writer.close()


def gzip_tree(chunks: Iterator[bytes], out: IO[bytes], max_bytes: int) -> int:
    """Docker's tar of /workspace (an iterator of chunks) as a tar.gz into `out`, without the
    runtime's `.deckhands/`; the bytes written. ArchiveTooLarge past `max_bytes` (gzipped)."""
    source = ChunkReader(chunks)
    counted = _Counted(out, max_bytes)
    with (
        tarfile.open(fileobj=source, mode="r|") as tar_in,
        tarfile.open(
            fileobj=cast(IO[bytes], counted), mode="w|gz", format=tarfile.PAX_FORMAT
        ) as tar_out,
    ):
        for member in tar_in:
            parts = member.name.split("/")
            if len(parts) > 1 and parts[1] == STATE_DIR:
                continue
            data = tar_in.extractfile(member) if member.isreg() else None
            tar_out.addfile(member, data)
    return counted.written


class ChunkReader(io.RawIOBase):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.chunk = b""
        self.at = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while self.at >= len(self.chunk):
            chunk = next(self.chunks, None)
            if chunk is None:
                return 0
            self.chunk, self.at = chunk, 0
        n = min(len(buffer), len(self.chunk) - self.at)
        buffer[:n] = self.chunk[self.at : self.at + n]
        self.at += n
        return n


class _Counted:
    """Counts what is written through it; past the limit, ArchiveTooLarge (once: the rest,
    such as the closing tarfile's last bytes, is dropped)."""

    def __init__(self, out: IO[bytes], limit: int) -> None:
        self.out = out
        self.limit = limit
        self.written = 0
        self.over = False

    def write(self, data: bytes) -> int:
        if self.over:
            return len(data)
        self.written += len(data)
        if self.written > self.limit:
            self.over = True
            raise ArchiveTooLarge(f"the workspace's archive passes {self.limit} bytes")
        self.out.write(data)
        return len(data)
