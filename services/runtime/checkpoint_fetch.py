"""Fetching the bytes of a checkpoint's new contents from the sandbox and storing them
(checkpoints.py): `pack` replies of up to 2 MiB, each content stored once, 16 at a time."""

from __future__ import annotations

import asyncio
import base64
import hashlib

from .checkpoint_manifest import Entry
from .checkpoint_store import CheckpointStore
from .sandbox import Sandbox

__all__ = ["fetch_and_store"]

_PACK_BYTES = 2 << 20
_PACK_FILES = 2000
_STORING = 16  # contents put at once


async def fetch_and_store(
    store: CheckpointStore,
    sandbox: Sandbox,
    task_id: str,
    paths: list[str],
    now: dict[str, Entry],
    timeout_s: float,
) -> tuple[int, int]:
    """Fetch `paths` from the sandbox and store their contents; (bytes stored, paths that
    could not be read). `now` is corrected to what was read."""
    stored = skipped = 0
    limit = asyncio.Semaphore(_STORING)
    puts: set[asyncio.Task[int]] = set()

    async def put(sha: str, data: bytes) -> int:
        async with limit:
            return await store.put_content(task_id, sha, data)

    try:
        index, start = 0, 0
        parts: list[bytes] = []
        seen: set[str] = set()
        while index < len(paths):
            batch = paths[index : index + _PACK_FILES]
            reply = await sandbox.session.pack(
                {"files": batch, "start": start, "max_bytes": _PACK_BYTES},
                timeout_s,
            )
            data = base64.b64decode(reply["data"])
            offset = 0
            last = -1
            for piece in reply["pieces"]:
                i = int(piece["i"])
                path = batch[i]
                last = i
                parts.append(data[offset : offset + piece["n"]])
                offset += piece["n"]
                if not piece["end"]:
                    continue
                content = b"".join(parts)
                parts = []
                if piece.get("error"):
                    skipped += 1
                    now.pop(path, None)
                    continue
                sha = hashlib.sha256(content).hexdigest()
                kind, mode, _, _ = now[path]
                now[path] = (kind, mode, len(content), sha)  # as read, if it changed since
                if sha not in seen:
                    seen.add(sha)
                    puts.add(asyncio.create_task(put(sha, content)))
            if last < 0:
                raise ValueError("the sandbox sent no piece of the files asked for")
            last_piece = reply["pieces"][-1]
            if last_piece["end"]:
                index, start = index + last + 1, 0
            else:
                index, start = index + last, sum(len(p) for p in parts)
            if len(puts) > 4 * _STORING:
                done, puts = await asyncio.wait(puts, return_when=asyncio.FIRST_COMPLETED)
                stored += sum(t.result() for t in done)
        if puts:
            done, _ = await asyncio.wait(puts)
            stored += sum(t.result() for t in done)
    finally:
        for left in puts:
            left.cancel()
    return stored, skipped
