"""One LLM call at start-up against a stub on loopback, so the first real step is not slow.

litellm and the OpenAI SDK import and build most of their modules and pydantic models on the
first completion, not at import: on this 2-core machine the first call took 16 s where the next
took 0.14 s, and every task posted in that window waited for it. Calling the same client path
once against a local stub that answers like an OpenAI-compatible server pays that cost before the
reasoner takes work. The stub gets no key of ours and no prompt of a user's, and nothing leaves
the machine. Only for OpenAI-compatible models (an `openai/` model or an API base), whose client
path is the one the stub speaks; another provider pays the cost on its first step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

__all__ = ["speaks_openai", "warm_up"]

log = logging.getLogger("deckhands.reasoner.warm_up")

_REPLY = json.dumps(
    {
        "id": "warm-up",
        "object": "chat.completion",
        "created": 0,
        "model": "warm-up",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_warm_up",
                            "type": "function",
                            "function": {"name": "think", "arguments": '{"thought": "warm-up"}'},
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


def speaks_openai(model: str, api_base: str | None) -> bool:
    return model.startswith("openai/") or bool(api_base)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip() or 0)
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            + f"Content-Length: {len(_REPLY)}\r\n\r\n".encode()
            + _REPLY
        )
        await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
        pass
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def warm_up(litellm: Any, request: dict[str, Any], timeout_s: float = 120.0) -> float:
    """Run `request` (litellm.acompletion keyword arguments) against the stub; seconds spent.
    Never raises: a warm-up that fails leaves the first step as slow as before, no worse."""
    server = await asyncio.start_server(_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    started = time.perf_counter()
    try:
        await asyncio.wait_for(
            litellm.acompletion(
                **{
                    **request,
                    "api_base": f"http://127.0.0.1:{port}/v1",
                    "api_key": "warm-up",
                    "messages": [{"role": "user", "content": "warm-up"}],
                    "timeout": timeout_s,
                }
            ),
            timeout_s,
        )
    except Exception as exc:  # whatever the stub's answer did to the client
        log.info("LLM client warm-up ended early: %s", type(exc).__name__)
    finally:
        server.close()
        await server.wait_closed()
    return time.perf_counter() - started
