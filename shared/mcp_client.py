"""Talking to the operator's MCP servers: list a server's tools, call one.

Each call opens its own session (a stdio server is started for it and stopped after; an HTTP
server gets a connection of its own) with a deadline: no session outlives the call, so a server
that crashed or hung costs one call, never the next ones. The `mcp` package (installed with
litellm[mcp]) speaks the protocol.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from .mcp_config import McpServerConfig, McpTool

__all__ = ["McpCallFailed", "call_tool", "list_tools"]

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
