"""The gateway builds its routes at start-up (services/gateway/http/warm_routes.py), so that
no request right after a start pays for it (FastAPI builds an included router's routes when a
request is first matched against them: ~250 ms of the gateway's CPU)."""

from __future__ import annotations

from typing import Any

import fastapi.routing
import pytest

from services.gateway.http.warm_routes import route_get, warm_routes
from services.gateway.main import build_app


async def _route(app: Any, path: str) -> None:
    # Matched and handled by the router alone: the handler fails without the app's state,
    # after every route on the way was matched.
    with pytest.raises(Exception):  # noqa: B017
        await route_get(app, path)


async def test_no_request_builds_a_route_after_the_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[str] = []
    create = fastapi.routing.create_model_field

    def counting(*args: Any, **kwargs: Any) -> Any:
        built.append(str(kwargs.get("name") or (args[0] if args else "")))
        return create(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "create_model_field", counting)
    app = build_app()
    await warm_routes(app)
    warmed = len(built)
    for path in ("/v1/tasks/t-1", "/v1/tasks", "/healthz", "/v1/admin/tenants"):
        await _route(app, path)
    assert built[warmed:] == []
