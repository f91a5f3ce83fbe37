"""Sizes in Docker's syntax (512m, 2g), and what the runtime's size settings come to in bytes.

`SandboxSizes` is a part of RuntimeSettings (settings.py), which declares the fields it reads.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

__all__ = ["SIZE", "SandboxSizes", "size_bytes"]

SIZE = re.compile(r"^\d+(\.\d+)?[bkmg]?$", re.IGNORECASE)


def size_bytes(value: str) -> int:
    """A size in docker's syntax (512m, 2g; suffixes b, k, m, g) in bytes."""
    value = value.lower()
    unit = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(value[-1], 1)
    number = value[:-1] if value[-1] in "bkmg" else value
    return int(float(number) * unit)


class SandboxSizes:
    """The size settings in bytes: a sandbox's file size limit, its /workspace quota (the
    pool's, or a task's own) and its container's memory limit."""

    if TYPE_CHECKING:  # RuntimeSettings' fields
        sandbox_memory: str
        sandbox_max_file_size: str
        sandbox_workspace: str
        sandbox_workspace_size: str
        sandbox_workspace_max_size: str

    @property
    def max_file_bytes(self) -> int:
        """sandbox_max_file_size in bytes."""
        return size_bytes(self.sandbox_max_file_size)

    @property
    def workspace_bytes(self) -> int | None:
        """The /workspace quota in bytes, or None when it is an (unsized) volume."""
        if self.sandbox_workspace != "tmpfs":
            return None
        return size_bytes(self.sandbox_workspace_size)

    def task_workspace_bytes(self, workspace_mib: int | None) -> int | None:
        """The quota of a task that asked for `workspace_mib` (capped at the maximum), when it
        is not the default one (then None: a warm sandbox of the pool will do)."""
        if workspace_mib is None or self.workspace_bytes is None:
            return None
        asked = min(workspace_mib << 20, size_bytes(self.sandbox_workspace_max_size))
        return None if asked == self.workspace_bytes else asked

    def container_memory_bytes_for(self, workspace_bytes: int | None) -> int:
        """The container's memory limit: the processes' memory plus a tmpfs workspace, whose
        pages are charged to the same cgroup (so a full workspace is ENOSPC, not an OOM)."""
        return size_bytes(self.sandbox_memory) + (workspace_bytes or self.workspace_bytes or 0)

    @property
    def container_memory_bytes(self) -> int:
        return self.container_memory_bytes_for(None)
