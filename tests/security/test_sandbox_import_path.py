"""The agent's files are not on the import path of the processes that hold the sandbox's
channel.

The image started its holder (root at first) and its executor (which holds the channel to the
runtime) with `python3 -c`, whose first import-path entry is the working directory:
/workspace, the agent's. A `difflib.py` the agent wrote there ran inside the executor at its
first edit (the executor imports difflib then), where it could write forged replies into the
channel; at the next start of a stopped sandbox, a `json.py` would have run in the holder as
root. The attack here is made through the API on the real stack: the agent plants modules of
the names the executor imports late, then edits a file; none of them may run (each would
leave /tmp/planted-<name>-<pid>, which the task's last command counts).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import Tenant  # type: ignore[import-not-found]

from shared.events import new_id

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_modules_the_agent_plants_in_the_workspace_never_run_in_the_executor(
    new_tenant: Callable[..., Tenant],
) -> None:
    tenant = new_tenant()
    task_id = tenant.create(task=f"plant-stdlib-modules: {new_id()}")
    tenant.wait(task_id, "FINISHED", "ERROR", "AWAITING_USER_INPUT", timeout_s=180)
    events = tenant.http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
    outputs = [e["content"] for e in events if e["kind"] == "run_output"]
    assert outputs and outputs[0].strip() == "planted", outputs  # the attack's first half
    edits = [e for e in events if e["kind"] == "edit_output"]
    assert len(edits) == 2 and "+second" in edits[1]["diff"], edits  # difflib's diff: it ran
    assert outputs[-1].strip() == "planted-ran: 0", outputs
