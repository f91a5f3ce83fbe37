"""MCP tool calls in the runtime: the operator's servers (DECKHANDS_MCP_SERVERS) are called
from the runtime's process, not from a sandbox, once the security monitor allowed the call,
over one long-lived session per server (a stdio server runs beside the runtime, started on the
first call). A call needs no sandbox; its answer is cut like a command's output."""

from __future__ import annotations

import logging

from shared.events import EventSource, MCPCallAction, MCPCallObservation
from shared.mcp_client import McpCallFailed, McpSession
from shared.mcp_config import McpServerConfig

from .actions import RuntimeObservation, error_observation, observation_id

__all__ = ["McpCalls"]

log = logging.getLogger("deckhands.runtime.mcp")


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half:,} characters cut ...]\n{text[-half:]}"


class McpCalls:
    def __init__(self, servers: list[McpServerConfig], output_limit: int) -> None:
        self.sessions = {server.name: McpSession(server) for server in servers}
        self.output_limit = output_limit

    async def close(self) -> None:
        for session in self.sessions.values():
            await session.close()

    async def run(self, action: MCPCallAction) -> RuntimeObservation:
        session = self.sessions.get(action.server)
        if session is None:
            return error_observation(
                action,
                f"there is no MCP server {action.server!r} on this runtime "
                "(DECKHANDS_MCP_SERVERS); the call was not made",
                "unknown_mcp_server",
            )
        try:
            text, is_error = await session.call(action.tool, action.arguments)
        except McpCallFailed as exc:
            log.warning(
                "task %s: MCP call %s.%s failed: %s",
                action.task_id,
                action.server,
                action.tool,
                exc,
            )
            return error_observation(action, f"the MCP call failed: {exc}", "mcp_failed")
        return MCPCallObservation(
            id=observation_id(action.id),
            task_id=action.task_id,
            source=EventSource.ENVIRONMENT,
            cause=action.id,
            server=action.server,
            tool=action.tool,
            content=_cut(text, self.output_limit),
            is_error=is_error,
        )
