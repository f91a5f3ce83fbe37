"""A task's /workspace restored from its last checkpoint (issue 28, item 3).

A task that has a checkpoint and gets a sandbox bound afresh lost its earlier one: its machine
or engine went, the container was removed under it, or its retention ended before a message
resumed it. Before its next action runs, the files of the checkpoint are written into the new
sandbox's /workspace (one tar through Docker's archive API, as an upload is), and the agent is
told, with that action's output, from which step its files come and what is not in them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import shlex
import tarfile
import tempfile
import time
from pathlib import Path

from shared.sandbox_protocol.session import SandboxSessionError

from .checkpoint_manifest import Entry
from .checkpoint_store import CheckpointStore
from .containers import DockerSandboxes
from .sandbox import Sandbox
from .workspace_files import put_archive

__all__ = ["Restored", "died_during_action", "restore_workspace"]

log = logging.getLogger("deckhands.runtime.checkpoints")

SANDBOX_UID = 1000  # the sandbox user, who owns what the agent wrote
_AHEAD = 32  # contents fetched ahead of the one being written


def died_during_action(reason: str, checkpoint_seq: int | None) -> str:
    """What the agent is told of a sandbox that died under its action: its files come back
    with the next action if the task has a checkpoint."""
    if checkpoint_seq is None:
        return (
            f"The sandbox died while running this action ({reason}). The workspace was "
            "lost: its files, the shell and the Python session are gone, and the action "
            "may have run partly. The next action runs in a fresh sandbox with an empty "
            "/workspace."
        )
    return (
        f"The sandbox died while running this action ({reason}): its shell and Python "
        "session are gone, and the action may have run partly. The next action runs in a "
        f"fresh sandbox whose /workspace is restored from the checkpoint after seq "
        f"{checkpoint_seq}."
    )


class Restored:
    def __init__(self, seq: int, files: int, size: int, took_s: float) -> None:
        self.seq, self.files, self.size, self.took_s = seq, files, size, took_s


async def restore_workspace(
    store: CheckpointStore, docker: DockerSandboxes, sandbox: Sandbox, task_id: str, seq: int
) -> Restored:
    """Write the files of the task's checkpoint at `seq` into the sandbox's /workspace."""
    started = time.monotonic()
    manifest = await store.manifest(task_id, seq)
    entries = _writable(manifest.entries)
    files = [(path, entry[3]) for path, entry in entries if entry[0] == "f"]
    fetches: collections.deque[asyncio.Task[bytes]] = collections.deque()
    waiting = iter(files)

    def fetch_more() -> None:
        while len(fetches) < _AHEAD:
            item = next(waiting, None)
            if item is None:
                return
            fetches.append(asyncio.create_task(store.get_content(task_id, item[1])))

    size = 0
    with tempfile.TemporaryDirectory(prefix="deckhands-restore-") as tmp:
        archive = Path(tmp) / "workspace.tar"
        try:
            with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
                fetch_more()
                for path, (kind, mode, _, content) in entries:
                    info = tarfile.TarInfo(path)
                    info.mode, info.uid, info.gid = mode, SANDBOX_UID, SANDBOX_UID
                    info.mtime = int(time.time())
                    if kind == "d":
                        info.type = tarfile.DIRTYPE
                        tar.addfile(info)
                    elif kind == "l":
                        info.type, info.linkname = tarfile.SYMTYPE, content
                        tar.addfile(info)
                    else:
                        data = await fetches.popleft()
                        fetch_more()
                        info.size = len(data)
                        size += len(data)
                        tar.addfile(info, _Reader(data))
        finally:
            for left in fetches:
                left.cancel()
        fetched = time.monotonic()
        await put_archive(docker, sandbox.container_id, archive)
    if manifest.cwd:  # the new shell starts where the last command left the old one
        with contextlib.suppress(SandboxSessionError, TimeoutError):
            await sandbox.session.bash(
                {"command": f"cd {shlex.quote(manifest.cwd)} 2>/dev/null", "timeout_s": 10}, 20
            )
    took = time.monotonic() - started
    log.info(
        "task %s: workspace restored from the checkpoint of seq %d (%d files, %d bytes, "
        "%.2fs: %.2fs to read them, %.2fs to write them)",
        task_id,
        seq,
        len(files),
        size,
        took,
        fetched - started,
        took - (fetched - started),
    )
    return Restored(seq, len(files), size, took)


def _writable(entries: dict[str, Entry]) -> list[tuple[str, Entry]]:
    """The entries in the order a tar needs (a folder before what it holds), without any a
    sandbox could have made to write elsewhere: a path that is absolute, climbs with `..`, or
    goes through a link (the scan never reports such; a manifest is still checked)."""
    links: set[str] = set()
    kept: list[tuple[str, Entry]] = []
    for path, entry in sorted(entries.items()):
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts):
            continue
        if any("/".join(parts[:i]) in links for i in range(1, len(parts))):
            continue
        if entry[0] == "l":
            links.add(path)
        kept.append((path, entry))
    return kept


class _Reader:
    """tarfile reads a member's bytes from a file object."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._at + size
        piece = self._data[self._at : end]
        self._at += len(piece)
        return bytes(piece)
