"""A task's workspace in and out, and the repository it starts from: the gateway's side.

The gateway never holds a tree in memory nor sends one through a NATS message: an upload is
streamed from the client into a temporary file (bounded by DECKHANDS_WORKSPACE_MAX_UPLOAD_BYTES
in http/limits.py), then into a transfer object of the blob store; the runtime, asked over
request/reply (shared/workspace.py), takes it from there. A download comes back the same way:
a transfer object the runtime wrote, streamed into a temporary file, then to the client.
Transfer objects are deleted once used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import nats.errors
from faststream.nats import NatsBroker
from pydantic import ValidationError

from shared.workspace import (
    WORKSPACE_SUBJECT,
    WorkspaceOp,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
    transfer_name,
)

from ..errors import GatewayError, StorageUnavailable
from ..tasks.service import TaskService

__all__ = [
    "WorkspaceError",
    "WorkspaceFile",
    "WorkspaceService",
]

log = logging.getLogger("deckhands.gateway.workspace")


class WorkspaceError(GatewayError):
    def __init__(self, status_code: int, detail: str, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status_code = status_code
        if retry_after is not None:
            self.headers = {"Retry-After": str(retry_after)}


_STATUS = {
    WorkspaceStatus.GONE: 410,
    WorkspaceStatus.NO_SANDBOX: 503,
    WorkspaceStatus.BAD_REQUEST: 400,
    WorkspaceStatus.NOT_FOUND: 404,
    WorkspaceStatus.TOO_LARGE: 413,
    WorkspaceStatus.UNAVAILABLE: 503,
}


@dataclass(frozen=True)
class WorkspaceFile:
    """A download waiting in a temporary file (removed once sent)."""

    path: str
    size: int


class WorkspaceService:
    def __init__(
        self,
        tasks: TaskService,
        broker: NatsBroker,
        transfers: WorkspaceTransfers,
        *,
        timeout_s: float,
        max_download_bytes: int,
    ) -> None:
        self.tasks = tasks
        self.broker = broker
        self.transfers = transfers
        self.timeout_s = timeout_s
        self.max_download_bytes = max_download_bytes

    async def _ask(self, request: WorkspaceRequest) -> WorkspaceReply:
        try:
            reply = await self.broker.request(
                request.model_dump_json().encode(), WORKSPACE_SUBJECT, timeout=self.timeout_s
            )
        except nats.errors.NoRespondersError as exc:
            raise StorageUnavailable("no runtime is listening for workspace requests") from exc
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise StorageUnavailable(
                f"the runtime did not answer within {self.timeout_s:g}s; retry later"
            ) from exc
        except nats.errors.Error as exc:
            raise StorageUnavailable(f"workspace request failed: {exc}") from exc
        try:
            answer = WorkspaceReply.model_validate_json(bytes(reply.body))
        except ValidationError as exc:
            raise StorageUnavailable("the runtime sent an invalid workspace reply") from exc
        if answer.status is not WorkspaceStatus.OK:
            retry = 5 if answer.status is WorkspaceStatus.NO_SANDBOX else None
            raise WorkspaceError(_STATUS[answer.status], answer.detail, retry)
        return answer

    async def download(
        self, task_id: str, tenant_id: str, op: WorkspaceOp, path: str | None = None
    ) -> WorkspaceFile:
        await self.tasks.get(task_id, tenant_id)  # another tenant's task: 404
        answer = await self._ask(
            WorkspaceRequest(op=op, task_id=task_id, path=path, max_bytes=self.max_download_bytes)
        )
        assert answer.object is not None
        fd, name = tempfile.mkstemp(prefix="deckhands-download-")
        try:
            with os.fdopen(fd, "wb") as target:
                await self.transfers.get(answer.object, target)
        except BaseException:
            os.unlink(name)
            raise
        finally:
            await self._delete(answer.object)
        return WorkspaceFile(name, os.stat(name).st_size)

    async def upload(
        self,
        task_id: str,
        tenant_id: str,
        body: AsyncIterator[bytes],
        *,
        path: str | None,
        archive: str | None,
        max_bytes: int,
    ) -> WorkspaceReply:
        await self.tasks.get(task_id, tenant_id)
        with tempfile.TemporaryFile(prefix="deckhands-upload-") as spool:
            size = 0
            async for chunk in body:
                size += len(chunk)
                if size > max_bytes:
                    raise WorkspaceError(
                        413,
                        f"the upload passes {max_bytes} bytes "
                        "(DECKHANDS_WORKSPACE_MAX_UPLOAD_BYTES)",
                    )
                spool.write(chunk)
            spool.seek(0)
            name = transfer_name(task_id)
            try:
                await self.transfers.put(name, spool)
            except Exception as exc:
                raise StorageUnavailable(f"the upload could not be kept: {exc}") from exc
        try:
            return await self._ask(
                WorkspaceRequest(
                    op=WorkspaceOp.PUT_TREE if archive else WorkspaceOp.PUT_FILE,
                    task_id=task_id,
                    path=path,
                    upload=name,
                    archive=archive,  # type: ignore[arg-type]
                    max_bytes=max_bytes,
                )
            )
        finally:
            await self._delete(name)

    async def _delete(self, name: str) -> None:
        with contextlib.suppress(Exception):
            await self.transfers.delete(name)
