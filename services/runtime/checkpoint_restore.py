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
import os
import shlex
import tarfile
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from nats.errors import Error as NatsError

from shared.commands import ExecuteAction
from shared.sandbox_protocol.session import SandboxSessionError

from .checkpoint_manifest import Entry
from .checkpoint_store import CheckpointMissing, CheckpointStore
from .containers import DockerSandboxes
from .sandbox import Sandbox
from .workspace_files import put_archive

__all__ = [
    "RestoreArchives",
    "Restored",
    "clear_workspace",
    "died_during_action",
    "put_back",
    "restore_workspace",
]

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


@dataclass(frozen=True)
class _Built:
    archive: Path
    files: int
    size: int
    cwd: str
    read_s: float


class RestoreArchives:
    """The tar of a checkpoint, built once for the restores that want it at about the same time
    (the forks of one task made together: ten forks read the checkpoint once) and kept on disk
    for `keep_s` after it was built."""

    def __init__(self, keep_s: float = 60.0) -> None:
        self.keep_s = keep_s
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._built: dict[tuple[str, int], tuple[float, asyncio.Future[_Built]]] = {}

    async def get(self, store: CheckpointStore, task_id: str, seq: int) -> _Built:
        self._expire()
        key = (task_id, seq)
        kept = self._built.get(key)
        if kept is None:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="deckhands-restore-")
            target = Path(self._dir.name) / f"{uuid.uuid4().hex}.tar"
            kept = (time.monotonic(), asyncio.ensure_future(_build(store, task_id, seq, target)))
            self._built[key] = kept
        try:
            return await asyncio.shield(kept[1])
        except BaseException:
            if self._built.get(key) is kept and kept[1].done():
                del self._built[key]  # the next restore tries again
            raise

    def _expire(self) -> None:
        now = time.monotonic()
        for key, (when, built) in list(self._built.items()):
            if now - when > self.keep_s and built.done():
                del self._built[key]
                if not built.cancelled() and built.exception() is None:
                    built.result().archive.unlink(missing_ok=True)

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        self._built.clear()


async def restore_workspace(
    store: CheckpointStore,
    docker: DockerSandboxes,
    sandbox: Sandbox,
    task_id: str,
    seq: int,
    archives: RestoreArchives | None = None,
) -> Restored:
    """Write the files of the task's checkpoint at `seq` into the sandbox's /workspace."""
    started = time.monotonic()
    own = archives or RestoreArchives(keep_s=0)
    try:
        built = await own.get(store, task_id, seq)
        await put_archive(docker, sandbox.container_id, built.archive)
    finally:
        if archives is None:
            own.close()
    if built.cwd:  # the new shell starts where the last command left the old one
        with contextlib.suppress(SandboxSessionError, TimeoutError):
            await sandbox.session.bash(
                {"command": f"cd {shlex.quote(built.cwd)} 2>/dev/null", "timeout_s": 10}, 20
            )
    took = time.monotonic() - started
    log.info(
        "task %s: workspace restored from the checkpoint of seq %d (%d files, %d bytes, "
        "%.2fs; %.2fs to read them)",
        task_id,
        seq,
        built.files,
        built.size,
        took,
        built.read_s,
    )
    return Restored(seq, built.files, built.size, took)


async def _build(store: CheckpointStore, task_id: str, seq: int, target: Path) -> _Built:
    """The checkpoint's files as one tar at `target`, contents read ahead of the writing."""
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
    try:
        with tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as tar:
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
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(target)
        raise
    finally:
        for left in fetches:
            left.cancel()
    return _Built(target, len(files), size, manifest.cwd, time.monotonic() - started)


async def put_back(
    store: CheckpointStore,
    docker: DockerSandboxes,
    sandbox: Sandbox,
    command: ExecuteAction,
    source: tuple[str, int] | None,
    archives: RestoreArchives,
    *,
    in_place: bool,
) -> tuple[str, bool]:
    """The files of checkpoint `source` (whose, seq; None: none, an empty /workspace) put into
    the sandbox: a new one (its task's earlier one is gone), or (`in_place`, a rewind) the
    task's own, emptied first. What the agent is told, and whether files were restored."""
    shell = (
        "The shell and the Python session are the same (their variables and background "
        "processes were not rewound)."
        if in_place
        else "The shell and the Python session are new: its variables and background "
        "processes are gone (the shell is back in the directory it was in)."
    )
    headline = _headline(command, source)
    try:
        if in_place:
            await clear_workspace(sandbox)
        if source is None:
            return (
                "This task was rewound to before any action changed files: /workspace is "
                f"empty again. {shell}",
                False,
            )
        owner, seq = source
        done = await restore_workspace(store, docker, sandbox, owner, seq, archives)
    except (CheckpointMissing, NatsError, OSError, TimeoutError, ValueError) as exc:
        log.warning("task %s: restore from %s failed: %r", command.task_id, source, exc)
        return (
            f"{headline} Its files could not be restored from its checkpoint "
            f"({type(exc).__name__}): /workspace is empty. {shell}",
            False,
        )
    after = command.action.seq
    missing = (
        f" What the actions after seq {seq} (up to seq {after - 1}) changed is not in it."
        if after and after - 1 > seq and not command.restore_first
        else ""
    )
    whose = "the" if owner == command.task_id else f"task {owner}'s"
    return (
        f"{headline} /workspace was restored from {whose} checkpoint taken after seq {seq} "
        f"({done.files} files).{missing} {shell}",
        True,
    )


def _headline(command: ExecuteAction, source: tuple[str, int] | None) -> str:
    """Why the agent's files were put back."""
    if command.restore_first:
        return "This task was rewound: its files go back to those of then."
    if source is None or source[0] == command.task_id:
        return "The task's sandbox was lost."
    return f"This task is a fork of task {source[0]}: its sandbox is new."


async def clear_workspace(sandbox: Sandbox) -> None:
    """Empty /workspace but for the runtime's own folder, before a rewound task's files go back
    (a file made after the point must not stay), and put the shell there."""
    reply = await sandbox.session.bash(
        {
            "command": "cd /workspace && find /workspace -mindepth 1 -maxdepth 1 "
            "! -name .deckhands -exec rm -rf -- {} + ; echo cleared",
            "timeout_s": 120,
        },
        150,
    )
    if "cleared" not in str(reply.get("output", "")):
        raise OSError(f"/workspace could not be emptied: {str(reply)[:200]}")


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
