"""A workspace going out: Docker's tar of /workspace, gzipped as it streams, without the
runtime's own `.deckhands/` directory (the baseline of an uploaded tree), never whole in memory.

Blocking (file I/O, compression): called on threads.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from typing import IO, cast

from .errors import ArchiveTooLarge
from .workspace_paths import STATE_DIR

__all__ = ["ChunkReader", "gzip_tree"]


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
