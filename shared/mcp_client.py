"""Talking to the operator's MCP servers: list a server's tools, call one.

`list_tools` and `call_tool` open a session of their own (a stdio server is started for it and
stopped after) with a deadline. `McpSession` keeps one open for many calls (the runtime's: a
stdio server started per call cost about 0.8 s); a server that crashed or hung costs the call
under way, and the next call opens a new session. The `mcp` package (installed with
litellm[mcp]) speaks the protocol.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from .mcp_config import McpServerConfig, McpTool

__all__ = ["McpCallFailed", "McpSession", "call_tool", "list_tools"]

_MAX_TOOLS = 64  # per server: every tool's schema is in every prompt


class McpCallFailed(Exception):
    """The server could not be reached, or did not answer in time."""


def _target(server: McpServerConfig) -> Any:
    from mcp import StdioServerParameters

    if server.url is not None:
        return server.url
    assert server.command is not None
    return StdioServerParameters(
        command=server.command[0],
        args=server.command[1:],
        env={**os.environ, **server.env},
        cwd=server.cwd,
    )


async def list_tools(server: McpServerConfig) -> list[McpTool]:
    from mcp import Client

    try:
        async with asyncio.timeout(server.timeout_s), Client(_target(server)) as client:
            listed = await client.list_tools()
    except Exception as exc:
        raise McpCallFailed(f"MCP server {server.name!r}: {type(exc).__name__}: {exc}") from exc
    return [
        McpTool(
            server=server.name,
            name=tool.name,
            description=tool.description or "",
            input_schema=dict(tool.input_schema or {"type": "object"}),
        )
        for tool in listed.tools[:_MAX_TOOLS]
    ]


def _text_of(result: Any) -> str:
    parts = []
    for block in result.content or []:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'content')}]")
    if not parts and result.structured_content is not None:
        parts.append(str(result.structured_content))
    return "\n".join(parts)


async def call_tool(
    server: McpServerConfig, tool: str, arguments: dict[str, Any]
) -> tuple[str, bool]:
    """(the result as text, whether the tool reported an error)."""
    from mcp import Client

    try:
        async with asyncio.timeout(server.timeout_s), Client(_target(server)) as client:
            result = await client.call_tool(tool, arguments)
    except TimeoutError as exc:
        raise McpCallFailed(
            f"MCP server {server.name!r} did not answer within {server.timeout_s:g}s"
        ) from exc
    except Exception as exc:
        raise McpCallFailed(f"MCP server {server.name!r}: {type(exc).__name__}: {exc}") from exc
    return _text_of(result), bool(result.is_error)


class McpSession:
    """A long-lived session to one server, for many calls (the runtime's): a stdio server is
    started once, not per call.

    The session's context is entered and left by a task of its own (the protocol library's
    cancel scopes must be), which holds it open until `close`; calls are made on it from any
    task, side by side. A call that fails to get an answer (the server died, hung past its
    deadline) drops the session, and the next call opens a new one."""

    def __init__(self, server: McpServerConfig) -> None:
        self.server = server
        self._holder: asyncio.Task[None] | None = None
        self._client: asyncio.Future[Any] | None = None
        self._closing: asyncio.Event | None = None
        self._lock = asyncio.Lock()

    async def _hold(self, ready: asyncio.Future[Any], closing: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(_target(self.server)) as client:
                ready.set_result(client)
                await closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(
                    McpCallFailed(f"MCP server {self.server.name!r}: {type(exc).__name__}: {exc}")
                )
            if not isinstance(exc, Exception):
                raise

    async def _session(self) -> Any:
        async with self._lock:
            if self._holder is None or self._holder.done():
                loop = asyncio.get_running_loop()
                self._client, self._closing = loop.create_future(), asyncio.Event()
                self._holder = asyncio.create_task(
                    self._hold(self._client, self._closing), name=f"mcp-{self.server.name}"
                )
            assert self._client is not None
            client = self._client
        async with asyncio.timeout(self.server.timeout_s):
            return await asyncio.shield(client)

    async def call(self, tool: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the result as text, whether the tool reported an error)."""
        try:
            client = await self._session()
            async with asyncio.timeout(self.server.timeout_s):
                result = await client.call_tool(tool, arguments)
        except McpCallFailed:
            await self.close()
            raise
        except TimeoutError as exc:
            await self.close()
            raise McpCallFailed(
                f"MCP server {self.server.name!r} did not answer within {self.server.timeout_s:g}s"
            ) from exc
        except Exception as exc:
            await self.close()
            raise McpCallFailed(
                f"MCP server {self.server.name!r}: {type(exc).__name__}: {exc}"
            ) from exc
        return _text_of(result), bool(result.is_error)

    async def close(self) -> None:
        """End the session (a stdio server is stopped); the next call opens a new one."""
        holder, closing = self._holder, self._closing
        self._holder = self._client = self._closing = None
        if holder is None or closing is None:
            return
        closing.set()
        try:
            await asyncio.wait_for(asyncio.shield(holder), 10.0)
        except BaseException:
            holder.cancel()
