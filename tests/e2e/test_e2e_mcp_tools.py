"""Issue 11, part 6, through the whole chain: the operator configures an MCP server of the
project's own (tools/mcp_demo, stdio) in DECKHANDS_MCP_SERVERS; the reasoner offers its tools
next to the built-in ones, the scripted LLM calls one, the security monitor reviews the call like
any action, the runtime makes it, and the agent reads the answer."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.stack import ROOT, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "mcp_tools.json"
SERVERS = [
    {"name": "tracker", "command": [sys.executable, "-m", "tools.mcp_demo"], "cwd": str(ROOT)}
]


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("mcp-tools")),
        llm_script=SCRIPT,
        extra_env={"DECKHANDS_POOL_MIN_IDLE": "1", "DECKHANDS_MCP_SERVERS": json.dumps(SERVERS)},
    )
    with (
        running(config) as stack,
        httpx.Client(
            base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
        ) as client,
    ):
        yield client


def _run(http: httpx.Client, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    answer = http.post("/v1/tasks", json={"task": text})
    assert answer.status_code == 202, answer.text
    return _run_until_done(http, answer.json()["id"])


def _run_until_done(
    http: httpx.Client, task_id: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    deadline = time.monotonic() + 90
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = http.get(f"/v1/tasks/{task_id}").json()
        if view["state"] in ("FINISHED", "ERROR"):
            break
        time.sleep(0.2)
    events = http.get(f"/v1/tasks/{task_id}/trajectory").json()["events"]
    return view, events


def _by_cause(events: list[dict[str, Any]], kind: str, cause: str) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == kind and e.get("cause") == cause]


def test_the_agent_calls_an_mcp_tool_through_the_monitor(http: httpx.Client) -> None:
    view, events = _run(http, "ticket status of DH-1")
    assert view["state"] == "FINISHED", view
    [call] = [e for e in events if e["kind"] == "mcp_call"]
    assert (call["server"], call["tool"], call["arguments"]) == (
        "tracker",
        "ticket_status",
        {"ticket": "DH-1"},
    )
    [verdict] = _by_cause(events, "security_verdict", call["id"])
    assert (verdict["verdict"], verdict["risk"]) == ("ALLOW", "MEDIUM"), verdict
    [answer] = _by_cause(events, "mcp_output", call["id"])
    assert answer["content"] == "open: the squares script prints 11 lines instead of 10"
    assert not answer["is_error"]
    assert "prints 11 lines" in view["result"]["final_message"]


def test_a_call_the_monitor_refuses_is_never_made(http: httpx.Client) -> None:
    view, events = _run(http, "dangerous comment on DH-1")
    assert view["state"] == "FINISHED", view
    [call] = [e for e in events if e["kind"] == "mcp_call"]
    [verdict] = _by_cause(events, "security_verdict", call["id"])
    assert verdict["verdict"] == "DENY" and verdict["rule"] == "delete_root", verdict
    assert _by_cause(events, "mcp_output", call["id"]) == []
    assert "comment 1 added" not in json.dumps(events)


def test_in_confirmation_mode_a_person_approves_the_call_first(http: httpx.Client) -> None:
    answer = http.post(
        "/v1/tasks",
        json={
            "task": "ticket status, with a person watching",
            "confirmation_mode": True,
            "confirmation_threshold": "MEDIUM",
        },
    )
    assert answer.status_code == 202, answer.text
    task_id = answer.json()["id"]
    deadline = time.monotonic() + 90
    while http.get(f"/v1/tasks/{task_id}").json()["state"] != "AWAITING_USER_CONFIRMATION":
        assert time.monotonic() < deadline, "the MCP call never waited for a person"
        time.sleep(0.2)
    events = http.get(f"/v1/tasks/{task_id}/trajectory").json()["events"]
    [call] = [e for e in events if e["kind"] == "mcp_call"]
    assert _by_cause(events, "mcp_output", call["id"]) == []  # not made before the approval
    approved = http.post(
        f"/v1/tasks/{task_id}/confirmation", json={"action_id": call["id"], "approve": True}
    )
    assert approved.status_code == 202, approved.text
    view, events = _run_until_done(http, task_id)
    assert view["state"] == "FINISHED", view
    [output] = _by_cause(events, "mcp_output", call["id"])
    assert output["content"].startswith("open: the squares script")
