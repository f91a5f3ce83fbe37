"""What the scripted server answers a chat request with: a reply, as OpenAI shapes one (whole
or streamed), or an error as OpenAI words one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["HttpError", "Reply"]


class HttpError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.code, self.retry_after_s = code, retry_after_s


@dataclass(frozen=True)
class Reply:
    content: str | None
    tool_name: str | None
    tool_arguments: str | None
    tool_call_id: str | None
    prompt_tokens: int
    completion_tokens: int

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_name else "stop"

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_name:
            msg["tool_calls"] = [self._tool_call()]
        return msg

    def _tool_call(self) -> dict[str, Any]:
        return {
            "id": self.tool_call_id,
            "type": "function",
            "function": {"name": self.tool_name, "arguments": self.tool_arguments},
        }

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def stream_deltas(self) -> Iterator[dict[str, Any]]:
        yield {"role": "assistant", "content": ""}
        if self.content:
            yield {"content": self.content}
        if self.tool_name:
            yield {"tool_calls": [{"index": 0, **self._tool_call()}]}
