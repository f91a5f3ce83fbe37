"""HTTP route of a task's blobs: content too large for an event, kept whole (claim checks)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from fastapi.responses import Response

from ..context import BlobServiceDep
from ..http.auth import CallerDep

__all__ = ["router"]

router = APIRouter(prefix="/v1/tasks", tags=["events"])

_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The content, as it was produced (UTF-8 text)",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    401: {"description": "No API key, or an unknown or revoked one"},
    404: {"description": "No such task of the caller's tenant, or the task has no such blob"},
}


@router.get(
    "/{task_id}/blobs/{sha256}",
    response_class=Response,
    responses=_RESPONSES,
    summary="Content an event refers to by its `content_ref` (e.g. a command's whole output)",
)
async def get_blob(
    task_id: str,
    sha256: Annotated[
        str, Path(pattern=r"^[0-9a-f]{64}$", description="`content_ref.sha256` of the event.")
    ],
    blobs: BlobServiceDep,
    caller: CallerDep,
) -> Response:
    data = await blobs.get(task_id, sha256, caller.tenant_id)
    return Response(
        data,
        media_type="text/plain; charset=utf-8",
        headers={"Cache-Control": "private, max-age=31536000, immutable"},  # content-addressed
    )
