"""Where checkpoints live: JetStream's object store (bucket CHECKPOINTS_BUCKET), which outlives
any sandbox and the machine under it, replicated as the streams are.

Layout, per task:
- `<task>/c/<sha256>`: a file's bytes, once per content (a checkpoint stores only contents the
  task has not stored before), zlib-compressed when that makes it smaller (first byte `z`,
  else `r`);
- `<task>/m/<seq>`: the manifest of the checkpoint taken after the action at `seq`
  (checkpoint_manifest.py), compressed.

A task's objects are found, and removed with it, by its prefix.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import time
import zlib
from collections.abc import Callable
from datetime import datetime

from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from shared.forks import manifest_object
from shared.subjects import CHECKPOINTS_BUCKET

from .checkpoint_manifest import Delta, Manifest

__all__ = ["CheckpointMissing", "CheckpointStore", "StoreFull"]

_COMPRESS_FROM = 256  # smaller contents are stored as they are


class CheckpointMissing(LookupError):
    """No such checkpoint or content (never stored, removed with its task or its retention)."""


class StoreFull(Exception):
    """The object store refused to keep more (its max_bytes)."""


def content_name(task_id: str, sha256: str) -> str:
    return f"{task_id}/c/{sha256}"


def manifest_name(task_id: str, seq: int) -> str:
    return manifest_object(task_id, seq)  # the gateway checks a fork's is kept by this name


def pack_content(data: bytes) -> bytes:
    if len(data) >= _COMPRESS_FROM:
        packed = zlib.compress(data, 1)
        if len(packed) < len(data):
            return b"z" + packed
    return b"r" + data


def unpack_content(stored: bytes) -> bytes:
    if stored[:1] == b"z":
        return zlib.decompress(stored[1:])
    return stored[1:]


class CheckpointStore:
    def __init__(self, jetstream: Callable[[], JetStreamContext], timeout_s: float = 60.0) -> None:
        self._jetstream = jetstream
        self._timeout_s = timeout_s
        self._store: ObjectStore | None = None
        # (task, seq) -> manifest: the chain a new checkpoint adds to, read once.
        self._manifests: dict[tuple[str, int], Manifest] = {}

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._jetstream().object_store(CHECKPOINTS_BUCKET)
        return self._store

    async def _put(self, name: str, data: bytes) -> None:
        store = await self._bucket()
        try:
            await asyncio.wait_for(store.put(name, data), self._timeout_s)
        except BadRequestError as exc:  # "maximum bytes exceeded", as JetStream says it
            if "maximum bytes" in str(exc).lower() or "insufficient" in str(exc).lower():
                raise StoreFull(str(exc)) from exc
            raise

    async def _get(self, name: str) -> bytes:
        """An object's bytes: its metadata, then its chunks by subject, each one direct get
        (raw bytes, no JSON or base64 to decode: a restore reads thousands of objects).
        nats-py's `get` makes a consumer per object, and a restore of 2,000 files reached the
        server's limit of consumers."""
        stream = f"OBJ_{CHECKPOINTS_BUCKET}"
        meta = f"$O.{CHECKPOINTS_BUCKET}.M.{base64.urlsafe_b64encode(name.encode()).decode()}"
        jsm = self._jetstream()
        try:
            async with asyncio.timeout(self._timeout_s):
                found = await jsm.get_msg(stream, subject=meta, direct=True)
                info = json.loads(found.data or b"{}")
                if info.get("deleted"):
                    raise CheckpointMissing(name)
                size = int(info.get("size") or 0)
                if not size:
                    return b""
                subject = f"$O.{CHECKPOINTS_BUCKET}.C.{info['nuid']}"
                data = bytearray()
                seq = 0
                for _ in range(int(info.get("chunks") or 1)):
                    msg = await jsm.get_msg(
                        stream, seq=seq, subject=subject, next=True, direct=True
                    )
                    data += msg.data or b""
                    seq = (msg.seq or seq) + 1
        except (ObjectNotFoundError, NotFoundError, KeyError, ValueError):
            raise CheckpointMissing(name) from None
        if len(data) != size or not _digest_matches(info.get("digest"), data):
            raise CheckpointMissing(f"{name}: its chunks do not match its size and digest")
        return bytes(data)

    # -- contents

    async def has_content(self, task_id: str, sha256: str) -> bool:
        store = await self._bucket()
        try:
            await asyncio.wait_for(store.get_info(content_name(task_id, sha256)), self._timeout_s)
        except (ObjectNotFoundError, NotFoundError):
            return False
        return True

    async def put_content(self, task_id: str, sha256: str, data: bytes) -> int:
        """Store a file's bytes; the bytes it takes in the store."""
        packed = pack_content(data)
        await self._put(content_name(task_id, sha256), packed)
        return len(packed)

    async def get_content(self, task_id: str, sha256: str) -> bytes:
        return unpack_content(await self._get(content_name(task_id, sha256)))

    # -- manifests

    async def put_manifest(self, task_id: str, delta: Delta, whole: Manifest) -> int:
        """Store a checkpoint (as its addition to the one before); the bytes it takes."""
        data = delta.encode()
        await self._put(manifest_name(task_id, delta.seq), data)
        self._remember(task_id, whole)
        return len(data)

    async def manifest(self, task_id: str, seq: int) -> Manifest:
        """The whole tree of the checkpoint at `seq` (its chain of additions applied)."""
        cached = self._manifests.get((task_id, seq))
        if cached is not None:
            return cached
        chain: list[Delta] = []
        whole: Manifest | None = None
        at: int | None = seq
        while at is not None:
            cached = self._manifests.get((task_id, at))
            if cached is not None:
                whole = cached
                break
            delta = Delta.decode(await self._get(manifest_name(task_id, at)))
            chain.append(delta)
            at = delta.base_seq
        if whole is None:
            whole = Manifest.whole(chain.pop())
        while chain:
            whole = whole.then(chain.pop())
        self._remember(task_id, whole)
        return whole

    def _remember(self, task_id: str, manifest: Manifest) -> None:
        # The latest of each task is what the next checkpoint adds to: keep one per task.
        for key in [k for k in self._manifests if k[0] == task_id]:
            del self._manifests[key]
        self._manifests[(task_id, manifest.seq)] = manifest

    def cached_tasks(self) -> set[str]:
        return {task_id for task_id, _ in self._manifests}

    def forget(self, task_id: str) -> None:
        for key in [k for k in self._manifests if k[0] == task_id]:
            del self._manifests[key]

    # -- removal

    async def _names(self) -> list[tuple[str, float]]:
        """Every object's name and when it was stored (seconds since the epoch)."""
        store = await self._bucket()
        try:
            infos = await asyncio.wait_for(store.list(ignore_deletes=True), self._timeout_s)
        except NotFoundError:  # an empty bucket lists as not found
            return []
        return [(info.name, _epoch(info.mtime)) for info in infos if info.name]

    async def remove_task(self, task_id: str, names: list[str] | None = None) -> int:
        """Remove every object of the task; how many there were."""
        self.forget(task_id)
        store = await self._bucket()
        if names is None:
            names = [n for n, _ in await self._names() if n.startswith(f"{task_id}/")]
        removed = 0
        for name in names:
            try:
                await asyncio.wait_for(store.delete(name), self._timeout_s)
                removed += 1
            except (ObjectNotFoundError, NotFoundError):
                continue
        return removed

    async def expired(self, older_than_s: float) -> dict[str, list[str]]:
        """The tasks whose newest object is older than `older_than_s`, with their objects."""
        newest: dict[str, float] = {}
        names: dict[str, list[str]] = {}
        for name, stored in await self._names():
            task_id = name.split("/", 1)[0]
            newest[task_id] = max(newest.get(task_id, 0.0), stored)
            names.setdefault(task_id, []).append(name)
        limit = time.time() - older_than_s
        return {task: names[task] for task, at in newest.items() if at < limit}


def _digest_matches(digest: str | None, data: bytes | bytearray) -> bool:
    """An object's digest as stored ("SHA-256=" and URL-safe base64) against its bytes."""
    if not digest:
        return True
    encoded = digest.split("=", 1)[1] if "=" in digest[:8] else digest
    try:
        stored = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except ValueError:
        return False
    return stored == hashlib.sha256(data).digest()


def _epoch(mtime: str | None) -> float:
    """An object's RFC 3339 time (nanoseconds and all) in seconds; unknown: now."""
    if not mtime:
        return time.time()
    trimmed = re.sub(r"(\.\d{6})\d+", r"\1", mtime).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(trimmed).timestamp()
    except ValueError:
        return time.time()
