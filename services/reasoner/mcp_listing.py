"""The reasoner's side of MCP tools: the tools of the operator's servers (DECKHANDS_MCP_SERVERS)
are listed and offered to the LLM (tools.offer_mcp_tools) at start-up; a server that does not
answer then is logged and asked again every `retry_s` until it does."""

from __future__ import annotations

import logging

from shared.mcp_client import McpCallFailed, list_tools
from shared.mcp_config import McpServerConfig

from .tools import offer_mcp_tools

__all__ = ["McpOffer"]

log = logging.getLogger("deckhands.reasoner.mcp")


class McpOffer:
    def __init__(self, servers: list[McpServerConfig], retry_s: float = 60.0) -> None:
        self.waiting = list(servers)  # servers whose tools are not offered yet
        self.retry_s = retry_s

    async def refresh(self) -> int:
        """Offer the tools of every waiting server that answers now; how many were offered."""
        offered = 0
        for server in list(self.waiting):
            try:
                listed = await list_tools(server)
            except McpCallFailed as exc:
                log.error("MCP server %s: its tools are not offered (yet): %s", server.name, exc)
                continue
            offer_mcp_tools(listed)
            self.waiting.remove(server)
            offered += len(listed)
            log.info("MCP server %s: %d tools offered", server.name, len(listed))
        return offered
