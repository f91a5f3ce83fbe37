"""What every body of HTTP API v1 shares: the bases of requests and views, and the refusals."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ApiRequest",
    "ApiView",
    "ErrorResponse",
    "InvalidRequestResponse",
    "QuotaExceededResponse",
]


class ApiRequest(BaseModel):
    # A misspelt field is a client bug: say so instead of silently ignoring it.
    model_config = ConfigDict(extra="forbid")


class ApiView(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ErrorResponse(BaseModel):
    """Every refusal but a validation error (422): what went wrong, and what to do about it."""

    detail: str


class QuotaExceededResponse(ErrorResponse):
    """A 429 at one of the tenant's quotas (Retry-After says when to try again)."""

    limit: str = Field(
        description="The quota reached: max_running_tasks, max_sandboxes, max_spend_usd_per_day "
        "or max_event_streams."
    )
    limit_value: float = Field(description="The tenant's value of that quota.")
    current: float = Field(description="What the tenant uses of it now.")


class InvalidRequestResponse(BaseModel):
    """422: each invalid field (`detail` a list, `message` a summary), or a request that
    contradicts an earlier one (`detail` a sentence, e.g. a reused Idempotency-Key)."""

    detail: list[dict[str, Any]] | str
    message: str | None = None
