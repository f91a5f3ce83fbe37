"""HTTP routes of a task's workspace: upload into it, download it (or one file), its diff.
Logic lives in WorkspaceService (workspace/service.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from shared.workspace import WorkspaceOp

from ..context import get_context
from ..errors import GatewayError
from ..http.auth import CallerDep
from ..http.models import ErrorResponse
from ..workspace.models import UploadResult
from ..workspace.service import WorkspaceFile, WorkspaceService

__all__ = ["router"]

router = APIRouter(prefix="/v1/tasks", tags=["workspace"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "A path outside /workspace, a bad archive"},
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
    404: {"model": ErrorResponse, "description": "No such task of the caller's tenant, or file"},
    410: {"model": ErrorResponse, "description": "The task's sandbox is gone (it ended long ago)"},
    413: {"model": ErrorResponse, "description": "Past a size limit (the detail names it)"},
    503: {
        "model": ErrorResponse,
        "description": "No sandbox yet (Retry-After), or the runtime or "
        "the blob store does not answer",
    },
}

PathQuery = Annotated[
    str | None,
    Query(
        # Characters, and percent-encoded a character may take 12 bytes of the request line:
        # 1,024 of them stay within the request's header limit (16 KiB, else 431).
        max_length=1024,
        description="A path in the workspace (relative to /workspace), at most 1,024 "
        "characters; `..` is refused.",
    ),
]


class _WorkspaceUnavailable(GatewayError):
    status_code = 503


async def _service(request: Request) -> WorkspaceService:
    await get_context(request)  # the gateway has started
    service = getattr(request.app.state, "workspace", None)
    if not isinstance(service, WorkspaceService):
        raise _WorkspaceUnavailable("workspaces are not available on this gateway")
    return service


async def _chunks(path: str) -> AsyncIterator[bytes]:
    """The file's bytes, then the file removed: also when the client goes away mid-way."""
    try:
        with open(path, "rb") as source:  # noqa: ASYNC230 (reads run on a thread below)
            while chunk := await asyncio.to_thread(source.read, 1 << 20):
                yield chunk
    finally:
        await asyncio.to_thread(os.unlink, path)


def _send(found: WorkspaceFile, media_type: str, filename: str | None) -> StreamingResponse:
    headers = {"Cache-Control": "no-store", "Content-Length": str(found.size)}
    if filename:
        headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{quote(filename)}"
    return StreamingResponse(_chunks(found.path), media_type=media_type, headers=headers)


@router.put(
    "/{task_id}/workspace",
    response_model=UploadResult,
    responses=_ERRORS,
    summary="Upload into the task's workspace: a tar (plain or compressed) or zip archive, "
    "extracted into /workspace (or under ?path=), or one file written at ?path=",
    openapi_extra={
        "requestBody": {
            "content": {
                "application/x-tar": {},
                "application/gzip": {},
                "application/zip": {},
                "application/octet-stream": {},
            },
            "required": True,
        }
    },
)
async def put_workspace(
    task_id: str,
    request: Request,
    caller: CallerDep,
    path: PathQuery = None,
    format: Annotated[
        Literal["tar", "zip", "file"] | None,
        Query(
            description="tar (any compression) or zip: an archive, extracted; file: the body "
            "is one file written at ?path=. Default: from the Content-Type (application/zip: "
            "zip; application/x-tar, application/gzip: tar), else a file when ?path= is given."
        ),
    ] = None,
) -> UploadResult:
    service = await _service(request)
    kind = format
    if kind is None:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if content_type in ("application/zip", "application/x-zip-compressed"):
            kind = "zip"
        elif content_type in (
            "application/x-tar",
            "application/gzip",
            "application/x-gzip",
            "application/x-gtar",
            "application/x-compressed-tar",
        ):
            kind = "tar"
        else:
            kind = "file" if path is not None else "tar"
    if kind == "file" and path is None:
        raise _BadRequest("?path= is needed to upload one file (or send an archive)")
    reply = await service.upload(
        task_id,
        caller.tenant_id,
        request.stream(),
        path=path,
        archive=None if kind == "file" else kind,
        max_bytes=request.app.state.settings.workspace_max_upload_bytes,
    )
    return UploadResult(files=reply.files)


class _BadRequest(GatewayError):
    status_code = 400


@router.get(
    "/{task_id}/workspace",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The whole workspace as a tar.gz (entries under `workspace/`), or "
            "with ?path= that file's bytes",
            "content": {"application/gzip": {}, "application/octet-stream": {}},
        },
        **_ERRORS,
    },
    summary="Download the task's workspace (a tar.gz), or one file of it with ?path=",
)
async def get_workspace(
    task_id: str, request: Request, caller: CallerDep, path: PathQuery = None
) -> StreamingResponse:
    service = await _service(request)
    if path is None:
        found = await service.download(task_id, caller.tenant_id, WorkspaceOp.GET_TREE)
        return _send(found, "application/gzip", f"workspace-{task_id}.tar.gz")
    found = await service.download(task_id, caller.tenant_id, WorkspaceOp.GET_FILE, path)
    return _send(found, "application/octet-stream", os.path.basename(path.rstrip("/")) or None)


@router.get(
    "/{task_id}/workspace/diff",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "A git diff (with binary patches) of the workspace against the "
            "commit the task started from (its repository), or against the tree last uploaded; "
            "new files included, those .gitignore names left out",
            "content": {"text/x-diff": {}},
        },
        **_ERRORS,
    },
    summary="The changes in the task's workspace, as a git diff",
)
async def get_workspace_diff(
    task_id: str, request: Request, caller: CallerDep
) -> StreamingResponse:
    service = await _service(request)
    found = await service.download(task_id, caller.tenant_id, WorkspaceOp.DIFF)
    return _send(found, "text/x-diff; charset=utf-8", None)
