"""Routes made ready before the first request.

FastAPI (0.165) builds each included router's routes (their parameters' and responses' fields,
TypeAdapters and all) the first time a request is matched against them: ~250 ms of CPU for
the gateway's routers. Right after a start, that landed on the first requests, and the 50
clients of a burst queued behind it (issue 25's `accept` row). One request for a path no route
has walks every router, so they are all built here, at start-up, through the app's own ASGI
interface: nothing leaves the process.
"""

from __future__ import annotations

import logging
import time

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.types import Message, Scope

__all__ = ["route_get", "warm_routes"]

log = logging.getLogger("deckhands.gateway")

# A path no route has: it is matched against every route, which builds them all.
_NOWHERE = "/.deckhands-warm-routes"


async def route_get(app: FastAPI, path: str) -> None:
    """A GET of `path` through the app's router alone (no middleware, no lifespan): every
    route on the way is matched, and built if it was not. What the router raises, it raises:
    a 404 for a path no route has, whatever a handler needs of the app's state without it."""
    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"localhost")],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "app": app,
        "state": {},
    }

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        return None

    await app.router(scope, receive, send)


async def warm_routes(app: FastAPI) -> float:
    """Build every route's state now; the seconds it took."""
    began = time.perf_counter()
    try:
        await route_get(app, _NOWHERE)
    except HTTPException:
        pass  # the 404 it is meant to end in
    took = time.perf_counter() - began
    log.debug("routes built in %.0f ms", took * 1000)
    return took
