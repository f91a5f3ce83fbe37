"""The blob store: large content that an event refers to instead of carrying (claim checks).

JetStream's object store (bucket BLOBS_BUCKET) chunks content of any size into messages below
`max_payload`; an event carries a BlobRef (SHA-256 and size) and stays small. Objects are
named `<task id>/<sha256>`: the same content of one task is kept once, and every blob of a task
can be found (and removed with it) by its prefix.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from .events import BlobRef
from .subjects import BLOBS_BUCKET

__all__ = ["BlobMissing", "BlobStore", "blob_name", "ensure_blob_bucket"]


class BlobMissing(LookupError):
    """No such blob (never kept, or removed with its task)."""


def blob_name(task_id: str, sha256: str) -> str:
    return f"{task_id}/{sha256}"


async def ensure_blob_bucket(
    js: JetStreamContext,
    max_bytes: int,
    replicas: int = 1,
    bucket: str = BLOBS_BUCKET,
    description: str = "Large content that deckhands events refer to (claim checks).",
) -> None:
    """Create the bucket unless it exists (idempotent, every service may call it)."""
    try:
        await js.object_store(bucket)
    except (BucketNotFoundError, NotFoundError):
        await js.create_object_store(
            bucket,
            ObjectStoreConfig(
                description=description,
                max_bytes=max_bytes,
                storage=StorageType.FILE,
                replicas=replicas,
            ),
        )


class BlobStore:
    """Put and get a task's blobs; the bucket is looked up once, on first use.

    `jetstream` gives the connection's JetStream context when first needed: services build
    their parts before the broker connects.
    """

    def __init__(self, jetstream: Callable[[], JetStreamContext], timeout_s: float = 30.0) -> None:
        self._jetstream = jetstream
        self._timeout_s = timeout_s
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._jetstream().object_store(BLOBS_BUCKET)
        return self._store

    async def put(self, task_id: str, data: bytes, media_type: str | None = None) -> BlobRef:
        ref = BlobRef(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        if media_type:
            ref = ref.model_copy(update={"media_type": media_type})
        store = await self._bucket()
        await asyncio.wait_for(store.put(blob_name(task_id, ref.sha256), data), self._timeout_s)
        return ref

    async def delete(self, task_id: str, sha256: str) -> bool:
        """Remove a blob (its task was deleted); False if there was none."""
        store = await self._bucket()
        try:
            await asyncio.wait_for(store.delete(blob_name(task_id, sha256)), self._timeout_s)
        except (ObjectNotFoundError, NotFoundError):
            return False
        return True

    async def get(self, task_id: str, sha256: str) -> bytes:
        store = await self._bucket()
        try:
            result = await asyncio.wait_for(store.get(blob_name(task_id, sha256)), self._timeout_s)
        except (ObjectNotFoundError, NotFoundError):
            raise BlobMissing(f"task {task_id} has no blob {sha256}") from None
        return bytes(result.data or b"")
