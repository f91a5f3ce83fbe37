"""What the agent is told when the sandbox's writable filesystems run out of room.

/workspace and /tmp are tmpfs mounts the runtime sizes (bytes and files, see docs/limits.md):
writing past them fails with ENOSPC like on any full disk. A command's own error ("No space
left on device") does not say that this is a quota, nor how large it is, so the executor adds
a note naming the limit and the use, whenever the output mentions the error or a filesystem is
(nearly) full after the command.

Loaded on first use (output.space_note): start-up counts.
"""

from __future__ import annotations

import os

from .config import WORKSPACE

__all__ = ["MOUNTS", "space_note", "usage"]

MOUNTS = (WORKSPACE, "/tmp")
ENOSPC_TEXT = "No space left on device"
# Free room under which a filesystem counts as full: what is left cannot hold a real file.
_FULL_BYTES = 1 << 20


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def usage(path: str) -> tuple[int, int, int, int] | None:
    """(bytes used, bytes limit, files used, files limit) of the filesystem at `path`."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    size = st.f_blocks * st.f_frsize
    return size - st.f_bavail * st.f_frsize, size, st.f_files - st.f_favail, st.f_files


def _full(used: int, size: int, files_used: int, files: int) -> bool:
    return size - used < min(_FULL_BYTES, size // 100 + 1) or (files > 0 and files_used >= files)


def space_note(output: str) -> str:
    """A note for the agent when it ran out of room (or nearly); else empty."""
    told = ENOSPC_TEXT in output
    parts = []
    for path in MOUNTS:
        seen = usage(path)
        if seen is None:
            continue
        used, size, files_used, files = seen
        full = _full(used, size, files_used, files)
        if not (told or full):
            continue
        parts.append(
            f"{path} {'is full' if full else 'has room'}: {_size(used)} of {_size(size)} used, "
            f"{files_used:,} of {files:,} files"
        )
    if not parts:
        return ""
    return (
        "[the sandbox's disk space is limited: "
        + "; ".join(parts)
        + ". Writing past a limit fails with 'No space left on device'; delete files (or write "
        "less) to go on]"
    )
