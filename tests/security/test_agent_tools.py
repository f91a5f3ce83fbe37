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
