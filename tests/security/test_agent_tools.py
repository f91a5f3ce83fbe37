"""The V1 tools attacked by a hostile tenant's agent (issue 29, item 4): a patch that names a
file outside the workspace is refused by the security monitor before anything runs, and the
arguments of glob and grep reach ripgrep as arguments: shell text in a pattern, a glob or an
include runs nothing. On the real stack, from the API."""

from __future__ import annotations

import pytest
from conftest import Tenant  # type: ignore[import-not-found]

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_a_patch_outside_the_workspace_is_refused_and_tool_arguments_run_nothing(
    alpha: Tenant,
) -> None:
    task_id = alpha.create(task="tool-attack: plant files through the tools")
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    listing = view["result"]["final_message"]
    assert "pwned" not in listing, listing  # no shell text in an argument ran
    assert "No such file" in listing, listing  # the patch wrote nothing outside /workspace
    log = alpha.log(task_id)
    [patch] = [e for e in log if e["kind"] == "apply_patch"]
    verdict = next(e for e in log if e["kind"] == "security_verdict" and e["cause"] == patch["id"])
    assert verdict["verdict"] == "DENY", verdict
    refused = [
        e for e in log if e["kind"] == "error" and e.get("cause") in (patch["id"], verdict["id"])
    ]
    assert refused and "outside the workspace" in refused[0]["content"], refused
    assert not [e for e in log if e["kind"] == "run_output" and e["cause"] == patch["id"]]


def test_each_call_a_reply_plans_is_reviewed_and_a_denial_drops_the_rest(alpha: Tenant) -> None:
    """A reply that writes out three calls (issue 29's planned calls): the first runs; the
    second, a patch outside the workspace, is reviewed like any action and denied; the third
    never runs, and the model is asked again."""
    task_id = alpha.create(task="plan-attack: hide a write behind a harmless first call")
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    listing = view["result"]["final_message"]
    assert "first.txt" in listing and "pwned-after-denial" not in listing, listing
    assert "No such file" in listing, listing  # nothing was written outside /workspace
    log = alpha.log(task_id)
    [first] = [e for e in log if e["kind"] == "run" and e["command"] == "echo one > first.txt"]
    assert [c["tool"] for c in first["planned"]] == ["apply_patch", "execute_bash"]
    [patch] = [e for e in log if e["kind"] == "apply_patch"]
    assert patch["llm_usage"] is None  # run from the plan, without asking the model
    verdict = next(e for e in log if e["kind"] == "security_verdict" and e["cause"] == patch["id"])
    assert verdict["verdict"] == "DENY", verdict
    assert not [e for e in log if e["kind"] == "run" and "pwned" in e["command"]]
