"""The reasoner's side of MCP tools: at start-up, the tools of the operator's servers
(DECKHANDS_MCP_SERVERS) are listed and offered to the LLM (tools.offer_mcp_tools)."""

from __future__ import annotations

import logging

from shared.mcp_client import McpCallFailed, list_tools
from shared.mcp_config import McpServerConfig, McpTool

__all__ = ["list_offered_tools"]

log = logging.getLogger("deckhands.reasoner.mcp")


async def list_offered_tools(servers: list[McpServerConfig]) -> list[McpTool]:
    """Every tool of every server that answers; a server that does not is logged (its tools
    are not offered until the reasoner starts again), the others are offered."""
    tools: list[McpTool] = []
    for server in servers:
        try:
            listed = await list_tools(server)
        except McpCallFailed as exc:
            log.error("MCP server %s: its tools are not offered: %s", server.name, exc)
            continue
        log.info("MCP server %s: %d tools offered", server.name, len(listed))
        tools += listed
    return tools
