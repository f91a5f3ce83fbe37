"""Serving a task's blobs: the whole outputs its events refer to (`content_ref`)."""

from __future__ import annotations

from shared.blobs import BlobMissing, BlobStore

from ..errors import BlobNotFound
from ..tasks.service import TaskService

__all__ = ["BlobService"]


class BlobService:
    def __init__(self, tasks: TaskService, blobs: BlobStore) -> None:
        self.tasks = tasks
        self.blobs = blobs

    async def get(self, task_id: str, sha256: str, tenant_id: str) -> bytes:
        await self.tasks.get(task_id, tenant_id)  # an unknown task is a 404 of its own
        try:
            return await self.blobs.get(task_id, sha256)
        except BlobMissing:
            raise BlobNotFound(task_id, sha256) from None
