"""A hostile agent against its workspace's checkpoints (issue 28), on the real stack: links to
files outside /workspace (the host's /etc/shadow, the executor's /proc/self, PID 1's
environment) and a fifo are planted, the task's sandbox is then removed under it, and the
workspace it gets back holds the links as links and the agent's own files, nothing read through
a link, no fifo waited on, and the task goes on."""

from __future__ import annotations

import time

import docker
import pytest
from conftest import Tenant

pytestmark = pytest.mark.timeout(300)


def test_a_restored_workspace_holds_links_as_links_and_nothing_read_through_them(
    alpha: Tenant,
) -> None:
    task_id = alpha.create(task="checkpoint-plant: links and a fifo")
    alpha.wait(task_id, "AWAITING_USER_INPUT", timeout_s=120)
    deadline = time.monotonic() + 60
    while True:
        taken = [e for e in alpha.log(task_id) if e["kind"] == "workspace_checkpoint"]
        if taken or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert taken and taken[-1]["checkpoint"], taken
    assert taken[-1]["skipped_paths"] >= 1  # the fifo: nothing to keep, nothing waited on
    assert "root:" not in str(taken)

    # The sandbox's machine is lost: its container goes from under the waiting task.
    client = docker.from_env(timeout=30)
    try:
        client.api.remove_container(f"deckhands-task-{task_id}", force=True)
    finally:
        client.close()
    sent = alpha.http.post(f"/v1/tasks/{task_id}/messages", json={"content": "go on"})
    assert sent.is_success, sent.text
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    final = view["result"]["final_message"]
    assert "restored from the checkpoint taken after seq" in final, final
    after = final.split("\n")
    assert "mine" in after and "nofifo" in after, final  # its own file; the fifo not kept
    assert {"/etc/shadow", "/proc/self", "/proc/1/environ"} <= set(after), final  # as links
    assert "root:" not in final and "DECKHANDS" not in final
