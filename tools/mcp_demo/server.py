"""A small MCP server of the project's own, on stdio: an issue tracker of three tickets.

    DECKHANDS_MCP_SERVERS='[{"name": "tracker", "command": ["python", "-m", "tools.mcp_demo"]}]'

offers the agent `mcp__tracker__ticket_status` and `mcp__tracker__add_comment` next to its
built-in tools. Used by tests/e2e/test_e2e_mcp_tools.py; nothing in it reaches the network.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["TICKETS", "main", "server"]

TICKETS = {
    "DH-1": "open: the squares script prints 11 lines instead of 10",
    "DH-2": "closed: README typo",
    "DH-3": "open: add a --limit flag",
}

server = MCPServer("deckhands-demo-tracker")


@server.tool()
def ticket_status(ticket: str) -> str:
    """The status and title of a ticket of the tracker, e.g. DH-1."""
    return TICKETS.get(ticket.upper(), f"no ticket {ticket!r}")


@server.tool()
def add_comment(ticket: str, comment: str) -> str:
    """Add a comment to a ticket; answers with the comment's number."""
    if ticket.upper() not in TICKETS:
        raise ToolError(f"no ticket {ticket!r}")  # reported to the caller as the tool's error
    return f"comment 1 added to {ticket.upper()}: {comment}"


@server.tool()
def server_process() -> int:
    """The process id of this server (tests check that a session is reused)."""
    return os.getpid()


def main() -> None:
    server.run()  # stdio
