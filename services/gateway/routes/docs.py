"""The API's OpenAPI document, for callers with a key (every route but the probes needs one).

FastAPI's own `/docs` page is not served: a browser cannot send a bearer key when it loads the
document, so the page could not work behind the key. Tools (client generators, schemathesis)
fetch `/openapi.json` with the key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..http.auth import AnyKeyDep

__all__ = ["router"]

router = APIRouter()


@router.get("/openapi.json", include_in_schema=False, dependencies=[AnyKeyDep])
async def openapi_document(request: Request) -> dict[str, Any]:
    document: dict[str, Any] = request.app.openapi()
    return document
