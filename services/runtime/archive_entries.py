"""The entries of an uploaded archive, read one by one: a tar (plain, gzip, bzip2 or xz) or a
zip, each entry as its kind, name, mode, time, size, data and link target, never the whole
archive in memory. What is not a directory, a regular file or a symbolic link is refused, and so
is a damaged archive (ArchiveRefused); workspace_archive.py checks and rewrites what they yield.

Blocking (file I/O, decompression): called on threads.
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

from .errors import ArchiveRefused

__all__ = ["Entry", "EntryData", "tar_entries", "zip_entries"]

_COPY_CHUNK = 1 << 20

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


class EntryData(io.RawIOBase):
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


Entry = tuple[str, str, int, float, int, IO[bytes] | None, str]


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


def tar_entries(source: IO[bytes]) -> Iterator[Entry]:
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


def zip_entries(source: IO[bytes]) -> Iterator[Entry]:
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
