"""What can go wrong behind the API, and the JSON answer each failure gets."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = [
    "ApiKeyNotFound",
    "EgressForbidden",
    "EgressPolicyRefused",
    "ForkPointGone",
    "ForkRefused",
    "GatewayError",
    "IdempotencyConflict",
    "InvalidCursor",
    "PayloadTooLarge",
    "PublishFailed",
    "QuotaExceeded",
    "StorageBadReply",
    "StorageBehind",
    "StorageUnavailable",
    "TaskNotFound",
    "TaskNotStopped",
    "TenantExists",
    "TenantNotFound",
    "TooManyStreams",
    "TrajectoryForbidden",
    "Unauthorized",
    "WorkspaceTooLarge",
    "install_error_handlers",
]

log = logging.getLogger("deckhands.gateway")


class GatewayError(Exception):
    """A failure with an HTTP status and a message the client can act on."""

    status_code = 500
    headers: dict[str, str] | None = None
    # Fields of the JSON answer besides `detail`, for a client to act on without parsing it.
    extra: dict[str, Any] | None = None

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class Unauthorized(GatewayError):
    """No API key, or one that is unknown or revoked. The answer never says which, so that it
    tells a guesser nothing."""

    status_code = 401
    headers = {"WWW-Authenticate": "Bearer"}


class TenantNotFound(GatewayError):
    status_code = 404

    def __init__(self, tenant_id: str) -> None:
        super().__init__(f"tenant {tenant_id!r} not found")


class TenantExists(GatewayError):
    status_code = 409

    def __init__(self, tenant_id: str, *, deleted: bool = False) -> None:
        super().__init__(
            f"tenant {tenant_id!r} was deleted: its id is not given again (its tasks' records "
            "still name it); choose another"
            if deleted
            else f"tenant {tenant_id!r} already exists"
        )


class ApiKeyNotFound(GatewayError):
    status_code = 404

    def __init__(self, tenant_id: str, prefix: str) -> None:
        super().__init__(f"tenant {tenant_id!r} has no API key {prefix!r}")


class TaskNotFound(GatewayError):
    status_code = 404

    def __init__(self, task_id: str) -> None:
        super().__init__(f"task {task_id!r} not found")
        self.task_id = task_id


class BlobNotFound(GatewayError):
    status_code = 404

    def __init__(self, task_id: str, sha256: str) -> None:
        super().__init__(f"task {task_id!r} has no blob {sha256!r}")


class ForkRefused(GatewayError):
    """A fork the task's log cannot give: a point whose files were not kept, a sub-task, or a
    task not started yet (the detail says which)."""

    status_code = 409


class ForkPointGone(GatewayError):
    """The checkpoint a fork would start from is no longer kept (past its retention)."""

    status_code = 410


class TaskNotStopped(GatewayError):
    """A task to delete did not reach a final state in time (its controller is busy or down);
    nothing was deleted, the client may retry."""

    status_code = 503


class EgressForbidden(GatewayError):
    """The task asked for network egress, which the operator disallowed."""

    status_code = 403


class EgressPolicyRefused(GatewayError):
    """An egress policy wider than its bound (a task's, or a tenant's bound wider than the
    server's), or a preset the server does not have: the detail names the rule or preset."""

    status_code = 422


class IdempotencyConflict(GatewayError):
    status_code = 422


class WorkspaceTooLarge(GatewayError):
    """A task asked for a /workspace quota above the operator's maximum."""

    status_code = 422


class InvalidCursor(GatewayError):
    status_code = 422


class StorageUnavailable(GatewayError):
    """The storage service did not answer a history query in time."""

    status_code = 503


class StorageBehind(StorageUnavailable):
    """Storage has not yet stored a task's log as far as its State says it goes."""

    def __init__(self, task_id: str, stored: int, logged: int) -> None:
        super().__init__(
            f"storage holds task {task_id}'s log up to seq {stored} of {logged}: it is still "
            "catching up; ask again shortly"
        )
        self.extra = {"stored_seq": stored, "last_seq": logged}


class StorageBadReply(GatewayError):
    status_code = 502


class PayloadTooLarge(GatewayError):
    """What the request asks to send would not fit in one message of the broker."""

    status_code = 413


class TooManyStreams(GatewayError):
    """The client already holds as many event streams as one client may."""

    status_code = 429


class TrajectoryForbidden(GatewayError):
    """Creating a task from a trajectory is a right the operator gives a tenant."""

    status_code = 403


class QuotaExceeded(GatewayError):
    """One of the tenant's quotas is reached: the answer names it, its value and the tenant's
    current use, and says when to retry (Retry-After, seconds)."""

    status_code = 429

    def __init__(
        self, limit: str, value: float, current: float, retry_after_s: int, detail: str
    ) -> None:
        super().__init__(f"quota {limit} reached: {detail}")
        self.headers = {"Retry-After": str(retry_after_s)}
        self.extra = {"limit": limit, "limit_value": value, "current": current}


class Overloaded(GatewayError):
    """More tasks are being created at once than this gateway takes: answered at once, with when
    to try again, rather than holding the connection."""

    status_code = 503

    def __init__(self, in_flight: int, retry_after_s: int) -> None:
        super().__init__(
            f"this gateway is creating {in_flight} tasks at once, its most "
            f"(DECKHANDS_MAX_CREATIONS_IN_FLIGHT); nothing was created: send the request again "
            f"after {retry_after_s}s"
        )
        self.headers = {"Retry-After": str(retry_after_s)}


class PublishFailed(GatewayError):
    """JetStream did not confirm a publish; nothing was accepted, the client may retry."""

    status_code = 503


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str:
    # ("body", "task") -> "task"; ("query", "after") -> "after"; keeps nested paths readable.
    parts = [str(p) for p in loc[1:]] if len(loc) > 1 else [str(p) for p in loc]
    return ".".join(parts)


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = []
    for error in exc.errors():
        error = dict(error)
        error.pop("input", None)  # never echo a (possibly huge or secret) body back
        error.pop("url", None)
        if error.get("type") == "json_invalid":
            # loc is ("body", <character offset>): the body as a whole is what is wrong.
            reason = (error.get("ctx") or {}).get("error", "invalid JSON")
            error["field"] = "body"
            error["msg"] = f"body is not valid JSON: {reason} (at character {error['loc'][-1]})"
        else:
            error["field"] = _field_name(error.get("loc", ()))
        errors.append(error)
    summary = "; ".join(f"{e['field']}: {e.get('msg', 'invalid')}" for e in errors)
    return JSONResponse(
        status_code=422,
        content=jsonable_encoder({"detail": errors, "message": f"invalid request: {summary}"}),
    )


# A 503 is worth retrying soon: the dependency is restarting or catching up. A 429 once one of
# the client's own streams has ended.
_RETRY_AFTER_S = {503: "1", 429: "5"}


def _invalid_body(reason: str) -> JSONResponse:
    error = {"type": "json_invalid", "loc": ["body"], "field": "body", "msg": reason}
    return JSONResponse(
        status_code=422, content={"detail": [error], "message": f"invalid request: body: {reason}"}
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's own refusals, in the gateway's shape. A body it cannot even decode (not UTF-8)
    is its 400 "error parsing the body": here it is what every other malformed body is, 422."""
    assert isinstance(exc, StarletteHTTPException)
    cause = exc.__cause__
    if exc.status_code == 400 and isinstance(cause, UnicodeDecodeError):
        return _invalid_body(f"body is not valid JSON: not UTF-8 ({cause.reason})")
    return JSONResponse(
        status_code=exc.status_code,
        content={"detail": exc.detail},
        headers=getattr(exc, "headers", None),
    )


async def _gateway_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GatewayError)
    if exc.status_code >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc.detail)
    retry_after = _RETRY_AFTER_S.get(exc.status_code)
    headers = dict(exc.headers or {})
    if retry_after:
        headers.setdefault("Retry-After", retry_after)
    return JSONResponse(
        status_code=exc.status_code,
        content={"detail": exc.detail, **(exc.extra or {})},
        headers=headers or None,
    )


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return JSONResponse(status_code=500, content={"detail": "internal error; see gateway logs"})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(Exception, _unexpected_error)
