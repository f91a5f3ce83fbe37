"""The web console (issue 13): static files under /ui, public; every API call they make needs
the key the user enters in the page.

The page keeps the key in the browser's sessionStorage and sends it as `Authorization: Bearer`
on each `fetch()`, never as a cookie: the gateway takes no cookie, so another site's page cannot
make the browser act with the key. The files are read once, when the app is built, from a fixed
list (no path from the request ever reaches the file system), and served with a strict
Content-Security-Policy: scripts and styles only from the gateway's own files, nothing inline,
no frames, requests only to the gateway itself.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

__all__ = ["CONTENT_SECURITY_POLICY", "UI_DIR", "UI_FILES", "router"]

UI_DIR = Path(__file__).resolve().parent.parent / "ui"

# The console's files and their types; anything else under /ui is a 404.
UI_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "render.js": "text/javascript; charset=utf-8",
    "stream.js": "text/javascript; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    ]
)

_SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    # Revalidated on every load (a new gateway version serves new files at once), cheap with
    # the ETag.
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class _File:
    body: bytes
    media_type: str
    etag: str


def _load() -> dict[str, _File]:
    files = {}
    for name, media_type in UI_FILES.items():
        body = (UI_DIR / name).read_bytes()
        files[name] = _File(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return files


_FILES = _load()

router = APIRouter(include_in_schema=False)


def _serve(name: str, request: Request) -> Response:
    file = _FILES.get(name)
    if file is None:
        return JSONResponse(
            {"detail": f"no file {name!r} in the web console; it starts at /ui/"},
            status_code=404,
        )
    headers = {**_SECURITY_HEADERS, "ETag": file.etag}
    if request.headers.get("if-none-match") == file.etag:
        return Response(status_code=304, headers=headers)
    return Response(file.body, media_type=file.media_type, headers=headers)


@router.get("/")
@router.get("/ui")
async def console_root() -> RedirectResponse:
    # Relative URLs in the page resolve under /ui/.
    return RedirectResponse("/ui/", status_code=308)


@router.get("/ui/")
async def console_page(request: Request) -> Response:
    return _serve("index.html", request)


@router.get("/ui/{name}")
async def console_file(name: str, request: Request) -> Response:
    return _serve(name, request)
