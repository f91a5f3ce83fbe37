"""Issue 4's rules through the real services: every process separate, real NATS, Redis and
Docker, the LLM reached by litellm over HTTP (the scripted server, tests/e2e/scripts)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_helpers import create_task, wait_for_state  # type: ignore[import-not-found]

from tools.run_task import run_task
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

SCRIPT = Path(__file__).parent / "scripts" / "agent_loop.json"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("agent-loop"))
    config = StackConfig.isolated(
        run_dir,
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            # A task here asks for network egress: the operator allows it (off by default).
            "DECKHANDS_ALLOW_NETWORK_EGRESS": "true",
            # And replays a trajectory: every tenant here may (the operator's choice).
            "DECKHANDS_ALLOW_TRAJECTORY_TASKS": "true",
            # The scripted model has no list price: give it one so budgets can be hit.
            "DECKHANDS_LLM_INPUT_COST_PER_TOKEN": "0.000001",
            "DECKHANDS_LLM_OUTPUT_COST_PER_TOKEN": "0.000002",
            # A killed service's unacknowledged message comes back after this.
            "DECKHANDS_ACK_WAIT_S": "5",
        },
    )
    with running(config) as stack:
        yield stack


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
    ) as client:
        yield client


def _events(http: httpx.Client, task_id: str) -> list[dict[str, Any]]:
    return list(http.get(f"/v1/tasks/{task_id}/trajectory").json()["events"])


def test_repeating_the_same_command_gets_a_hint_then_ends_in_error_naming_the_pattern(
    http: httpx.Client,
) -> None:
    task_id = create_task(http, task="repeat: look at the workspace")
    view = wait_for_state(http, task_id, "ERROR", "FINISHED")
    assert view["state"] == "ERROR"
    assert "stuck in a loop: repeating action/observation" in view["reason"]
    assert "after the agent was told" in view["reason"]
    events = _events(http, task_id)
    kinds = [e["kind"] for e in events if e["kind"] in ("run", "loop_hint")]
    # Four identical runs, the hint, four more (the loop formed again).
    assert kinds == ["run"] * 4 + ["loop_hint"] + ["run"] * 4, kinds


def test_only_a_task_that_opted_in_gets_a_network(http: httpx.Client) -> None:
    online = create_task(http, task="network: list the interfaces", network_egress=True)
    offline = create_task(http, task="network: list the interfaces")
    seen = {}
    for task_id in (online, offline):
        view = wait_for_state(http, task_id, "FINISHED", "ERROR")
        assert view["state"] == "FINISHED", view
        [output] = [e for e in _events(http, task_id) if e["kind"] == "run_output"]
        seen[task_id] = output["content"].split()
    assert "eth0" in seen[online] and "lo" in seen[online]
    assert seen[offline] == ["lo"]  # network_mode none: loopback only


def test_over_budget_stops_and_a_user_message_raises_the_limit(http: httpx.Client) -> None:
    task_id = create_task(http, task="budget: think it over", max_budget_usd=0.0001)
    view = wait_for_state(http, task_id, "ERROR")
    assert "maximum budget" in view["reason"]
    spent = view["usage"]["cost_usd"]
    assert spent >= 0.0001

    assert http.post(f"/v1/tasks/{task_id}/messages", json={"content": "go on"}).status_code == 202
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        view = http.get(f"/v1/tasks/{task_id}").json()
        if view["usage"]["llm_calls"] >= 2 and view["state"] == "ERROR":
            break
        time.sleep(0.2)
    assert view["max_budget_usd"] == pytest.approx(spent + 0.0001)
    assert view["usage"]["llm_calls"] >= 2 and "maximum budget" in view["reason"]


def test_rejected_action_gives_a_user_reject_observation(http: httpx.Client) -> None:
    task_id = create_task(
        http,
        task="risky: install requests",
        confirmation_mode=True,
        confirmation_threshold="MEDIUM",
    )
    view = wait_for_state(http, task_id, "AWAITING_USER_CONFIRMATION")
    action_id = view["pending_action"]["id"]
    assert view["pending_action"]["command"] == "pip install requests"
    answer = http.post(
        f"/v1/tasks/{task_id}/confirmation", json={"action_id": action_id, "approve": False}
    )
    assert answer.status_code == 202, answer.text
    view = wait_for_state(http, task_id, "FINISHED")
    events = _events(http, task_id)
    rejected = [e for e in events if e["kind"] == "user_rejected"]
    assert len(rejected) == 1 and rejected[0]["cause"] == action_id
    assert not [e for e in events if e["kind"] == "run_output"]  # it never ran


def test_delegated_sub_task_outputs_reach_the_parent(http: httpx.Client) -> None:
    task_id = create_task(http, task="parent: delegate the arithmetic")
    view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED", view
    assert len(view["sub_tasks"]) == 1
    child = view["sub_tasks"][0]
    output = [e for e in _events(http, task_id) if e["kind"] == "delegate_output"]
    assert len(output) == 1
    assert output[0]["outputs"] == {"value": 100} and output[0]["agent_state"] == "FINISHED"
    assert "computed 100" in view["result"]["final_message"]
    child_view = http.get(f"/v1/tasks/{child['id']}").json()
    assert child_view["parent_task_id"] == task_id and child_view["state"] == "FINISHED"


def _shape(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    # A workspace checkpoint is logged whenever the runtime has stored it, while the agent
    # thinks: between two steps, or after the task ended; where it falls is no part of the
    # agent's course.
    return [(e["source"], e["kind"]) for e in events if e["kind"] != "workspace_checkpoint"]


def test_replayed_trajectory_reproduces_the_original_without_the_llm(
    http: httpx.Client, stack: Stack
) -> None:
    original = run_task(
        stack.config.gateway_url,
        "print the squares",
        timeout_s=120,
        out=io.StringIO(),
        api_key=stack.api_key,
    )
    trajectory = http.get(f"/v1/tasks/{original['id']}/trajectory").json()
    llm = f"http://127.0.0.1:{stack.config.llm_port}/stats"
    before = httpx.get(llm).json()["requests"]

    replay_id = create_task(http, task="an unscripted task, replayed", trajectory=trajectory)
    view = wait_for_state(http, replay_id, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED"
    assert "10 squared is 100" in view["result"]["final_message"]
    assert httpx.get(llm).json()["requests"] == before  # no LLM call at all
    assert _shape(_events(http, replay_id)) == _shape(trajectory["events"])


def test_killing_controller_and_reasoner_mid_task_does_not_change_the_outcome(
    http: httpx.Client, stack: Stack
) -> None:
    task_id = create_task(http, task="slow squares: print them")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the reasoner is now waiting on the slow LLM turn
        if any(e["kind"] == "write_output" for e in _events(http, task_id)):
            break
        time.sleep(0.1)
    stack.kill_service("reasoner")
    stack.kill_service("controller")
    time.sleep(1)
    stack.start_service("controller")
    stack.start_service("reasoner")
    view = wait_for_state(http, task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED"
    assert "10 squared is 100" in view["result"]["final_message"]
    kinds = [e["kind"] for e in _events(http, task_id)]
    assert kinds.count("run") == 1 and kinds.count("write") == 1 and kinds.count("finish") == 1


def test_a_large_write_travels_as_a_claim_check_and_a_large_cell_is_refused(
    http: httpx.Client,
) -> None:
    """1.5 MB of file content (more than a NATS message carries) is written through the blob
    store; 2.1 MB of Python code is refused with an error the agent sees, and the task goes on."""
    task_id = create_task(http, task="big: write a large file")
    view = wait_for_state(http, task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    assert view["result"]["final_message"].startswith("size: 1500000\n0123456789abcde\n")
    events = _events(http, task_id)
    write = next(e for e in events if e["kind"] == "write")
    assert write["content"] == "" and write["content_ref"]["size"] == 1_500_000
    content = http.get(f"/v1/tasks/{task_id}/blobs/{write['content_ref']['sha256']}")
    assert content.status_code == 200 and content.text == "0123456789abcde\n" * 93_750
    refused = next(e for e in events if e["kind"] == "error")
    assert "bytes once encoded, over the limit" in refused["content"]
    assert not any(e["kind"] == "run_python" for e in events)


def test_the_v1_tools_find_search_patch_and_plan_in_the_sandbox(http: httpx.Client) -> None:
    """glob and grep leave out what .gitignore names; a patch with a hunk that does not apply
    changes nothing and names it; the right one applies; the plan is the task's."""
    task_id = create_task(http, task="v1-tools: fix add")
    view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED", view
    assert "return a + b" in view["result"]["final_message"], view
    assert view["plan"] == [
        {"title": "find the bug", "status": "done", "notes": ""},
        {"title": "fix it", "status": "done", "notes": "a patch"},
    ], view["plan"]
    events = _events(http, task_id)
    outputs = {e["cause"]: e for e in events if e["kind"] == "run_output"}
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_kind.setdefault(e["kind"], []).append(e)
    [glob] = by_kind["glob"]
    [grep] = by_kind["grep"]
    bad, good = by_kind["apply_patch"]
    found = outputs[glob["id"]]["content"]
    assert "src/calc.py" in found and "build/gen.py" not in found, found
    matched = outputs[grep["id"]]["content"]
    assert "src/calc.py:2:    return a - b" in matched and "build" not in matched, matched
    refused = outputs[bad["id"]]
    assert refused["exit_code"] != 0, refused
    assert "patch failed: src/calc.py:1" in refused["content"], refused["content"]
    assert outputs[good["id"]]["exit_code"] == 0, outputs[good["id"]]
    assert len(by_kind["task_tracker"]) == 2
