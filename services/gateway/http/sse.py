"""Server-Sent Events framing (https://html.spec.whatwg.org/multipage/server-sent-events.html)."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["SSE_HEADERS", "sse_comment", "sse_event", "sse_retry"]

# Proxies must neither cache nor buffer a live stream.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_event(event_id: int, name: str, data: Any) -> str:
    # Compact JSON never contains a raw newline, so the payload is exactly one data line.
    payload = json.dumps(data, separators=(",", ":"), default=str)
    name = "".join(name.split()) or "message"
    return f"id: {event_id}\nevent: {name}\ndata: {payload}\n\n"


def sse_comment(text: str) -> str:
    return f": {' '.join(text.splitlines())}\n\n"


def sse_retry(milliseconds: int) -> str:
    return f"retry: {milliseconds}\n\n"
