"""A sandbox's /workspace read and written from outside it: a file, the tree, a diff, an archive.

Docker's archive API reads and writes the sandbox's /workspace whether the sandbox runs, is
paused or is stopped (a keeper holds a stopped one's tmpfs). The `*_sync` functions block: they
run on DockerSandboxes' threads (`docker.call`). The diff runs git in a helper container
(workspace_helper.py), never in the runtime's process.
"""

from __future__ import annotations

import base64
import json
import tarfile
from pathlib import Path
from typing import IO, Any

from .containers import DockerSandboxes
from .errors import ArchiveRefused, ArchiveTooLarge
from .workspace_archive import ChunkReader, gzip_tree
from .workspace_git import diff_script
from .workspace_helper import run_helper

__all__ = ["diff", "file_sync", "put_archive", "tree_sync"]

_S_IFDIR = 1 << 31  # Go's os.ModeDir, as Docker's path stat gives it
_S_IFLNK = 1 << 27  # os.ModeSymlink


def _stat_sync(docker: DockerSandboxes, container_id: str, path: str) -> dict[str, Any] | None:
    api = docker.api()
    response = api.head(api._url("/containers/{0}/archive", container_id), params={"path": path})
    if response.status_code == 404:
        return None
    api._raise_for_status(response)
    header = response.headers.get("X-Docker-Container-Path-Stat", "")
    return dict(json.loads(base64.b64decode(header))) if header else {}


def file_sync(
    docker: DockerSandboxes, container_id: str, path: str, out: IO[bytes], max_bytes: int
) -> int:
    """The regular file at `path` (under /workspace) written to `out`; its size."""
    # Every directory on the way must be one (not a symbolic link that leads elsewhere).
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        sub = "/workspace/" + "/".join(parts[:i])
        stat = _stat_sync(docker, container_id, sub)
        if stat is None:
            raise FileNotFoundError(f"the workspace has no {'/'.join(parts[:i])}")
        mode = int(stat.get("mode", 0))
        if mode & _S_IFLNK:
            raise ArchiveRefused(
                f"{'/'.join(parts[:i])} is a symbolic link (to {stat.get('linkTarget')}); "
                "name the file it points to"
            )
        if i < len(parts) and not mode & _S_IFDIR:
            raise FileNotFoundError(f"{'/'.join(parts[:i])} is not a directory")
        if i == len(parts) and mode & _S_IFDIR:
            raise ArchiveRefused(
                f"{path} is a directory: GET .../workspace without ?path= gives the tree"
            )
        if i == len(parts) and int(stat.get("size", 0)) > max_bytes:
            raise ArchiveTooLarge(
                f"{path} holds {stat.get('size')} bytes, more than the limit of {max_bytes}"
            )
    stream, _ = docker.api().get_archive(container_id, "/workspace/" + path)
    source = ChunkReader(iter(stream))
    with tarfile.open(fileobj=source, mode="r|") as tar:
        for member in tar:
            if not member.isreg():
                raise ArchiveRefused(f"{path} is not a regular file")
            data = tar.extractfile(member)
            assert data is not None
            written = 0
            while chunk := data.read(1 << 20):
                written += len(chunk)
                if written > max_bytes:
                    raise ArchiveTooLarge(f"{path} is larger than {max_bytes} bytes")
                out.write(chunk)
            return written
    raise FileNotFoundError(f"the workspace has no {path}")


def tree_sync(docker: DockerSandboxes, container_id: str, out: IO[bytes], max_bytes: int) -> int:
    """The whole /workspace, gzipped into `out`; its size."""
    stream, _ = docker.api().get_archive(container_id, "/workspace")
    return gzip_tree(iter(stream), out, max_bytes)


async def diff(
    docker: DockerSandboxes, container_id: str, result: Path, max_bytes: int, timeout_s: float
) -> int:
    """The workspace's changes since its baseline, written to `result`; their size."""
    with result.open("wb") as out:
        outcome = await run_helper(
            docker,
            container_id,
            diff_script(),
            out=out,
            max_out=max_bytes,
            timeout_s=timeout_s,
        )
        size = out.tell()
    if outcome.exit_code == 3:
        raise FileNotFoundError(" ".join(outcome.stderr.split()))
    if outcome.exit_code != 0:
        raise OSError(f"git diff failed (exit {outcome.exit_code}): {outcome.stderr[-500:]}")
    if outcome.truncated:
        raise ArchiveTooLarge(f"the diff is larger than {max_bytes} bytes")
    return size


async def put_archive(docker: DockerSandboxes, container_id: str, archive: Path) -> None:
    """Extract the tar `archive` into the sandbox's /workspace (a checkout's .git, an upload)."""

    def put() -> None:
        with archive.open("rb") as data:
            if not docker.api().put_archive(container_id, "/workspace", data):
                raise OSError("Docker did not accept the archive")

    await docker.call(put)
