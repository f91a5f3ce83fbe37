"""The MCP client on a real stdio server (tools/mcp_demo): its tools listed as the LLM is
offered them, a call answered, a tool's own error reported as one, a server that cannot start
named in the failure, and the configuration's checks."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.mcp_client import McpCallFailed, call_tool, list_tools
from shared.mcp_config import McpServerConfig, function_name, parse_function_name

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DEMO = McpServerConfig(
    name="tracker", command=[sys.executable, "-m", "tools.mcp_demo"], cwd=str(ROOT), timeout_s=30
)


async def test_tools_are_listed_with_their_schemas() -> None:
    tools = {tool.name: tool for tool in await list_tools(DEMO)}
    assert set(tools) == {"ticket_status", "add_comment"}
    spec = tools["ticket_status"].spec()["function"]
    assert spec["name"] == "mcp__tracker__ticket_status"
    assert spec["parameters"]["required"] == ["ticket"]
    assert "[MCP server tracker]" in spec["description"]


async def test_a_call_and_a_tool_error() -> None:
    assert await call_tool(DEMO, "ticket_status", {"ticket": "DH-2"}) == (
        "closed: README typo",
        False,
    )
    text, is_error = await call_tool(DEMO, "no_such_tool", {})
    assert is_error and "no_such_tool" in text


async def test_a_server_that_cannot_start_is_named() -> None:
    broken = McpServerConfig(name="broken", command=["/nonexistent/mcp-server"], timeout_s=10)
    with pytest.raises(McpCallFailed, match="broken"):
        await list_tools(broken)


def test_names_and_configuration() -> None:
    assert parse_function_name(function_name("tracker", "ticket_status")) == (
        "tracker",
        "ticket_status",
    )
    assert parse_function_name("execute_bash") is None
    with pytest.raises(ValidationError, match="exactly one of command or url"):
        McpServerConfig(name="x", command=["a"], url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValidationError):
        McpServerConfig(name="Bad Name", command=["a"])


async def test_a_tool_s_own_refusal_reaches_the_caller() -> None:
    text, is_error = await call_tool(DEMO, "add_comment", {"ticket": "XX-9", "comment": "hi"})
    assert is_error and "no ticket 'XX-9'" in text
