"""Forks and rewinds (issue 28) against a hostile tenant, on the real stack: another tenant's
task can be neither forked nor rewound (404, as if it did not exist, and nothing is made or
logged), and a request cannot name the checkpoint a fork starts from (the gateway finds it in
the parent's own log): a forged `checkpoint` or `forked_from` is refused by name."""

from __future__ import annotations

import time

import pytest
from conftest import Tenant

pytestmark = pytest.mark.timeout(300)


def test_another_tenants_task_can_be_neither_forked_nor_rewound(
    alpha: Tenant, beta: Tenant
) -> None:
    task_id = alpha.create(task="count: forks")
    alpha.wait(task_id, "AWAITING_USER_INPUT", timeout_s=120)
    before = alpha.log(task_id)
    point = before[-1]["seq"]
    for path, body in (("fork", {"at": point, "count": 3}), ("rewind", {"to": point})):
        answer = beta.http.post(f"/v1/tasks/{task_id}/{path}", json=body)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["detail"] == f"task {task_id!r} not found"
    assert beta.http.get("/v1/tasks", params={"forked_from": task_id}).json()["tasks"] == []
    assert alpha.http.get("/v1/tasks", params={"forked_from": task_id}).json()["tasks"] == []
    assert [e["id"] for e in alpha.log(task_id)] == [e["id"] for e in before]  # nothing logged


def test_a_fork_cannot_be_told_where_its_files_come_from(alpha: Tenant, beta: Tenant) -> None:
    theirs = beta.create(task="count: the files to steal")
    beta.wait(theirs, "AWAITING_USER_INPUT", timeout_s=120)
    mine = alpha.create(task="count: mine")
    alpha.wait(mine, "AWAITING_USER_INPUT", timeout_s=120)
    deadline = time.monotonic() + 60  # its checkpoint is logged while the agent asks
    while not any(e["kind"] == "workspace_checkpoint" for e in alpha.log(mine)):
        assert time.monotonic() < deadline, alpha.log(mine)
        time.sleep(0.5)
    point = alpha.log(mine)[-1]["seq"]
    for forged in (
        {"checkpoint": f"{theirs}/2"},
        {"forked_from": theirs},
        {"limits": {"checkpoint_task": theirs}},
    ):
        answer = alpha.http.post(f"/v1/tasks/{mine}/fork", json={"at": point, **forged})
        assert answer.status_code == 422, (forged, answer.text)
        field = next(iter(forged)) if "limits" not in forged else "checkpoint_task"
        assert field in answer.text, answer.text
    # The fork it may make starts from its own task's files, named by the gateway.
    made = alpha.http.post(f"/v1/tasks/{mine}/fork", json={"at": point})
    assert made.status_code == 202, made.text
    assert (made.json()["checkpoint"] or "").startswith(f"{mine}/")
