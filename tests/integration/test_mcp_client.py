"""The MCP client on a real stdio server (tools/mcp_demo): its tools listed as the LLM is
offered them, a call answered, a tool's own error reported as one, a server that cannot start
named in the failure, and the configuration's checks."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.mcp_client import McpCallFailed, McpSession, call_tool, list_tools
from shared.mcp_config import McpServerConfig, function_name, parse_function_name

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
DEMO = McpServerConfig(
    name="tracker", command=[sys.executable, "-m", "tools.mcp_demo"], cwd=str(ROOT), timeout_s=30
)


async def test_tools_are_listed_with_their_schemas() -> None:
    tools = {tool.name: tool for tool in await list_tools(DEMO)}
    assert set(tools) == {"ticket_status", "add_comment", "server_process"}
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


async def test_a_session_serves_many_calls_and_reopens_after_its_server_died() -> None:
    session = McpSession(DEMO)
    try:
        first, _ = await session.call("server_process", {})
        assert [await session.call("ticket_status", {"ticket": "DH-3"}) for _ in range(5)] == [
            ("open: add a --limit flag", False)
        ] * 5
        assert (await session.call("server_process", {}))[0] == first  # one server for all
        os.kill(int(first), signal.SIGKILL)
        with pytest.raises(McpCallFailed, match="tracker"):
            await session.call("ticket_status", {"ticket": "DH-1"})
        again, _ = await session.call("server_process", {})
        assert again != first  # a new server, started for the next call
    finally:
        await session.close()


async def test_the_reasoner_offers_a_late_server_s_tools_once_it_answers(tmp_path: Path) -> None:
    from services.reasoner import tool_specs
    from services.reasoner.mcp_listing import McpOffer

    flag = tmp_path / "up"
    late = McpServerConfig(
        name="late",
        command=["sh", "-c", f'test -f {flag} && exec "{sys.executable}" -m tools.mcp_demo'],
        cwd=str(ROOT),
        timeout_s=20,
    )
    specs, offered = list(tool_specs.TOOL_SPECS), dict(tool_specs._MCP_TOOLS)
    try:
        offer = McpOffer([DEMO, late])
        assert await offer.refresh() == 3  # the demo's tools; `late` does not start yet
        assert [s.name for s in offer.waiting] == ["late"]
        flag.touch()
        assert await offer.refresh() == 3
        assert offer.waiting == []
        names = {spec["function"]["name"] for spec in tool_specs.TOOL_SPECS}
        assert {"mcp__tracker__ticket_status", "mcp__late__ticket_status"} <= names
    finally:
        tool_specs.TOOL_SPECS[:] = specs
        tool_specs._MCP_TOOLS.clear()
        tool_specs._MCP_TOOLS.update(offered)
