"""What an LLM call's failure is: its kind, which says how it is handled (llm.py), and how long
the provider asks to wait before the next try."""

from __future__ import annotations

import time
from email.utils import parsedate_to_datetime
from typing import Any

__all__ = ["failure_kind", "retry_after_s"]


def _headers(exc: BaseException) -> dict[str, str]:
    found: dict[str, str] = {}
    response = getattr(exc, "response", None)
    for source in (
        getattr(response, "headers", None),
        getattr(exc, "litellm_response_headers", None),
        getattr(exc, "headers", None),
    ):
        try:
            found.update({str(k).lower(): str(v) for k, v in (source or {}).items()})
        except (AttributeError, TypeError):
            continue
    return found


def retry_after_s(exc: BaseException) -> float | None:
    """The provider's Retry-After (or retry-after-ms) on an error, in seconds, if it gave one."""
    headers = _headers(exc)
    try:
        if "retry-after-ms" in headers:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if value is None:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = parsedate_to_datetime(value)  # the HTTP-date form
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def failure_kind(litellm: Any, exc: BaseException) -> str:
    """'context_window', 'rate_limit', 'transient' (worth retrying) or 'fatal'."""
    if isinstance(exc, litellm.ContextWindowExceededError):
        return "context_window"
    status = getattr(exc, "status_code", None)
    if isinstance(exc, litellm.RateLimitError) or status == 429:
        return "rate_limit"
    if isinstance(exc, litellm.Timeout | litellm.APIConnectionError):
        return "transient"
    if isinstance(status, int) and status >= 500:
        return "transient"
    return "fatal"
