"""Forks (issue 28, item 2) on the real stack: gateway, controller, reasoner (scripted LLM),
security, runtime (Docker), storage, NATS and Redis.

The parent (tests/e2e/scripts/forks.json, "fork-me:") makes a.txt and d.txt and leaves its shell
in sub/ (action 1), then lists the files and writes mine.txt (action 2), then writes b.txt and
deletes d.txt (action 3). A fork at the output of action 1 must start with a.txt and d.txt, no
mine.txt, in sub/, and the log to that point; then it goes on with the same script, writing
its message into mine.txt: what each fork lists shows it ran in a workspace of its own.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_helpers import log_of, wait_for_state  # type: ignore[import-not-found]

from tools.api_access import auth_headers, issue_key
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "forks.json"
RETENTION_S = 30  # checkpoints, after a task's last one
SWEEP_S = 2


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("forks")),
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "2",
            "DECKHANDS_CHECKPOINT_RETENTION_S": str(RETENTION_S),
            "DECKHANDS_CHECKPOINT_SWEEP_INTERVAL_S": str(SWEEP_S),
        },
    )
    with running(config) as stack:
        yield stack


@pytest.fixture
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=60
    ) as client:
        yield client


def _outputs(events: list[dict[str, Any]]) -> list[str]:
    """The fork's own command outputs, in order."""
    return [
        e["content"] for e in events if e["kind"] == "run_output" and not e.get("inherited_from")
    ]


def _parent(http: httpx.Client) -> tuple[str, list[dict[str, Any]], int]:
    """A finished parent, its log, and the seq of its first command's output (the fork
    point)."""
    created = http.post("/v1/tasks", json={"task": "fork-me: make files"})
    assert created.status_code == 202, created.text
    task_id = str(created.json()["id"])
    assert wait_for_state(http, task_id, "FINISHED")["state"] == "FINISHED"
    events = log_of(http, task_id)
    first = next(e for e in events if e["kind"] == "run")
    point = next(
        e["seq"] for e in events if e["kind"] == "run_output" and e["cause"] == first["id"]
    )
    # Its checkpoints are logged while the agent thinks: wait for the last action's.
    deadline = time.monotonic() + 30
    while sum(e["kind"] == "workspace_checkpoint" for e in events) < 3:
        assert time.monotonic() < deadline, [e["kind"] for e in events]
        time.sleep(0.3)
        events = log_of(http, task_id)
    return task_id, events, point


def _fork(http: httpx.Client, task_id: str, **body: Any) -> dict[str, Any]:
    answer = http.post(f"/v1/tasks/{task_id}/fork", json=body)
    assert answer.status_code == 202, answer.text
    return dict(answer.json())


def test_a_fork_starts_from_exactly_the_files_and_log_of_its_point(http: httpx.Client) -> None:
    parent, events, point = _parent(http)
    made = _fork(http, parent, at=point, message="fork-solo", labels=["try:solo"])
    assert made["forked_from"] == parent and made["checkpoint"].startswith(f"{parent}/")
    [fork] = [f["id"] for f in made["forks"]]

    view = wait_for_state(http, fork, "FINISHED")
    assert (view["forked_from"], view["forked_at"], view["labels"]) == (
        parent,
        point,
        ["try:solo"],
    )
    log = log_of(http, fork)
    inherited = [e for e in log if e.get("inherited_from")]
    assert {e["inherited_from"] for e in inherited} == {parent}
    assert max(e["seq"] for e in inherited) == point
    # The parent's entries 2..point, as they were (under ids of the fork's own).
    parents = [e for e in events if 1 < e["seq"] <= point]
    assert [(e["kind"], e["seq"], e["timestamp"]) for e in inherited] == [
        (e["kind"], e["seq"], e["timestamp"]) for e in parents
    ]
    assert not {e["id"] for e in inherited} & {e["id"] for e in parents}
    assert log[0]["kind"] == "task_created" and log[0]["forked_from"] == parent
    own = [e for e in log if e["seq"] > point]
    assert own[0]["kind"] == "message" and own[0]["content"] == "fork-solo"

    listed, moved_on = _outputs(log)
    # The shell starts where the parent's was; the files are the point's: d.txt (deleted
    # later by the parent) is there, mine.txt (written later) is not.
    assert "/workspace/sub" in listed and "a.txt d.txt sub" in listed, listed
    assert "mine.txt" not in listed.split("/workspace/sub", 1)[1]
    assert f"fork of task {parent}" in listed  # the agent is told where its files came from
    assert "a.txt b.txt mine.txt sub" in moved_on and "fork-solo" in moved_on, moved_on

    forks = http.get("/v1/tasks", params={"forked_from": parent}).json()["tasks"]
    assert [t["id"] for t in forks] == [fork]
    assert forks[0]["forked_at"] == point


def test_ten_forks_at_once_each_write_in_a_workspace_of_their_own(http: httpx.Client) -> None:
    parent, _, point = _parent(http)
    made = _fork(http, parent, at=point, count=10, message="fork-many")
    forks = [f["id"] for f in made["forks"]]
    assert len(set(forks)) == 10
    for fork in forks:
        assert wait_for_state(http, fork, "FINISHED", "ERROR", timeout_s=240)["state"] == "FINISHED"
        listed, moved_on = _outputs(log_of(http, fork))
        # No other fork's mine.txt or b.txt, and d.txt still there to delete: each fork's
        # /workspace is its own copy of the point's.
        assert "a.txt d.txt sub" in listed and "b.txt" not in listed, (fork, listed)
        assert "a.txt b.txt mine.txt sub fork-many" in moved_on.replace("\n", " "), moved_on


def test_a_forks_log_outlives_its_parent(http: httpx.Client) -> None:
    parent, _, point = _parent(http)
    [fork] = [f["id"] for f in _fork(http, parent, at=point)["forks"]]
    wait_for_state(http, fork, "FINISHED")  # without a message: the agent goes on from the point
    before = log_of(http, fork)
    assert http.delete(f"/v1/tasks/{parent}").status_code == 204
    assert http.get(f"/v1/tasks/{parent}").status_code == 404
    assert log_of(http, fork) == before
    # The fork's files are its own too: a fork of the fork starts from them.
    last = before[-1]["seq"]
    [grandchild] = [f["id"] for f in _fork(http, fork, at=last, message="again")["forks"]]
    assert wait_for_state(http, grandchild, "FINISHED")["forked_from"] == fork


def test_forks_that_cannot_be_made_are_refused_clearly(stack: Stack, http: httpx.Client) -> None:
    parent, events, point = _parent(http)
    other = issue_key(stack.config.gateway_url, stack.admin_api_key, "fork-other-tenant")
    stranger = http.post(
        f"/v1/tasks/{parent}/fork", json={"at": point}, headers=auth_headers(other)
    )
    assert stranger.status_code == 404, stranger.text
    end = events[-1]["seq"]
    past = http.post(f"/v1/tasks/{parent}/fork", json={"at": end + 5})
    assert past.status_code == 422 and f"ends at seq {end}" in past.text, past.text
    many = http.post(f"/v1/tasks/{parent}/fork", json={"at": point, "count": 1000})
    assert many.status_code == 422 and "count" in many.text
    assert http.get("/v1/tasks", params={"forked_from": parent}).json()["tasks"] == []

    # Past the retention, the checkpoint is gone: 410, and no fork made.
    time.sleep(RETENTION_S + 4 * SWEEP_S)
    gone = http.post(f"/v1/tasks/{parent}/fork", json={"at": point})
    assert gone.status_code == 410 and "no longer kept" in gone.text, gone.text
    assert http.get("/v1/tasks", params={"forked_from": parent}).json()["tasks"] == []


def test_a_rewind_takes_the_files_and_the_course_back_and_keeps_the_log(
    stack: Stack, http: httpx.Client
) -> None:
    task_id, events, point = _parent(http)
    steps = http.get(f"/v1/tasks/{task_id}").json()["iterations"]
    answer = http.post(f"/v1/tasks/{task_id}/rewind", json={"to": point})
    assert answer.status_code == 202, answer.text
    assert answer.json()["kind"] == "rewind"
    # The rewind is logged after everything (nothing deleted), then the task goes on.
    deadline = time.monotonic() + 60
    while True:
        log = log_of(http, task_id)
        marks = [e for e in log if e["kind"] == "rewind"]
        ended = [
            e
            for e in log
            if e["kind"] == "agent_state_changed"
            and e["agent_state"] in ("FINISHED", "ERROR")
            and marks
            and e["seq"] > marks[0]["seq"]
        ]
        if ended:
            break
        assert time.monotonic() < deadline, [e["kind"] for e in log]
        time.sleep(0.3)
    [mark] = marks
    assert mark["rewound_to"] == point and mark["seq"] > events[-1]["seq"]
    assert [e["id"] for e in log[: len(events)]] == [e["id"] for e in events]
    after = [e["content"] for e in log if e["kind"] == "run_output" and e["seq"] > mark["seq"]]
    listed, moved_on = after[0], after[1]
    # The files of the point, in place: d.txt back, b.txt and mine.txt (made later) gone.
    assert "This task was rewound" in listed and "/workspace/sub" in listed, listed
    assert "a.txt d.txt sub" in listed and "b.txt" not in listed, listed
    assert "a.txt b.txt mine.txt sub" in moved_on, moved_on
    # The point's steps, then the same three again: the rewound ones are not counted.
    course = [
        (e["seq"], e["kind"], e.get("agent_state") or e.get("command") or "")
        for e in log_of(http, task_id)
        if e["seq"] >= mark["seq"]
    ]
    assert wait_for_state(http, task_id, "FINISHED")["iterations"] == steps, course

    # Refused: a task that is not paused or ended, another tenant's, a seq past the end.
    asking = http.post("/v1/tasks", json={"task": "ask-me: something"}).json()["id"]
    wait_for_state(http, asking, "AWAITING_USER_INPUT")
    busy = http.post(f"/v1/tasks/{asking}/rewind", json={"to": 2})
    assert busy.status_code == 409 and "pause it first" in busy.text, busy.text
    other = issue_key(stack.config.gateway_url, stack.admin_api_key, "rewind-other-tenant")
    stranger = http.post(
        f"/v1/tasks/{task_id}/rewind", json={"to": point}, headers=auth_headers(other)
    )
    assert stranger.status_code == 404
    past = http.post(f"/v1/tasks/{task_id}/rewind", json={"to": 10_000})
    assert past.status_code == 422 and "ends at seq" in past.text


def test_a_fork_at_an_upload_starts_with_the_uploaded_files(http: httpx.Client) -> None:
    created = http.post("/v1/tasks", json={"task": "upload-me: look at my files"})
    assert created.status_code == 202, created.text
    task_id = str(created.json()["id"])
    assert wait_for_state(http, task_id, "AWAITING_USER_INPUT")["state"] == "AWAITING_USER_INPUT"
    put = http.put(
        f"/v1/tasks/{task_id}/workspace", params={"path": "docs/up.txt"}, content=b"uploaded\n"
    )
    assert put.status_code == 200 and put.json() == {"files": 1}, put.text

    # The log marks the upload, and the runtime's checkpoint of it comes at its seq.
    deadline = time.monotonic() + 30
    while True:
        events = log_of(http, task_id)
        up = next((e for e in events if e["kind"] == "workspace_uploaded"), None)
        kept = [
            e
            for e in events
            if up is not None
            and e["kind"] == "workspace_checkpoint"
            and e["action_seq"] == up["seq"]
        ]
        if kept:
            break
        assert time.monotonic() < deadline, [e["kind"] for e in events]
        time.sleep(0.3)
    assert up is not None and (up["path"], up["files"], up["format"]) == ("docs/up.txt", 1, "file")
    assert kept[0]["checkpoint"] == f"{task_id}/{up['seq']}", kept

    # A fork at the upload has its files; one at the seq before it does not.
    [with_files] = [f["id"] for f in _fork(http, task_id, at=up["seq"], message="go on")["forks"]]
    [without] = [f["id"] for f in _fork(http, task_id, at=up["seq"] - 1, message="go on")["forks"]]
    done = wait_for_state(http, with_files, "FINISHED")
    assert "docs" in done["result"]["final_message"], done
    assert "uploaded" in done["result"]["final_message"], done
    other = wait_for_state(http, without, "FINISHED")
    assert "docs" not in other["result"]["final_message"].split("cat:")[0], other
    assert "No such file" in other["result"]["final_message"], other
