"""No task hangs silently, and a log of megabytes keeps working: every service a separate
process on real NATS, Redis and Docker (issues #8 and #15).

- a step nobody answers (the reasoner is down) is asked for again after its deadline, then the
  task ends in ERROR naming the reasoner; a user message resumes it once the reasoner is back;
- a step that needs storage while storage is down (a new reasoner replica, which has none of
  the task's history) is dead-lettered and ends the task in ERROR with the reason at once; a user
  message resumes it once storage is back;
- a task whose log passes 2 MB keeps stepping, and `GET /events` pages through all of it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_helpers import wait_for_state  # type: ignore[import-not-found]

from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

SCRIPT = Path(__file__).parent / "scripts" / "finish_at_once.json"
AGENT_DEADLINE_S = 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("no-silent-hang")),
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_AGENT_ANSWER_DEADLINE_S": str(AGENT_DEADLINE_S),
            "DECKHANDS_ANSWER_RETRIES": "1",
            "DECKHANDS_DEADLINE_POLL_S": "0.5",
            "DECKHANDS_RETRY_BACKOFF_S": "0.2",
            "DECKHANDS_RETRY_BACKOFF_MAX_S": "0.5",
            "DECKHANDS_HISTORY_WAIT_S": "0.5",
            "DECKHANDS_HISTORY_REQUEST_TIMEOUT_S": "0.5",
            "DECKHANDS_POOL_MIN_IDLE": "0",
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


def _create(http: httpx.Client, text: str) -> str:
    response = http.post("/v1/tasks", json={"task": text})
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _say(http: httpx.Client, task_id: str, text: str) -> None:
    response = http.post(f"/v1/tasks/{task_id}/messages", json={"content": text})
    assert response.status_code == 202, response.text


def _stored(http: httpx.Client, task_id: str, timeout_s: float = 30) -> None:
    """Until storage holds the task's whole log (the events page is read from storage). A
    storage killed before it acknowledged a batch gets it back only after the consumer's
    ack_wait, so a test that kills storage waits for this first."""
    deadline = time.monotonic() + timeout_s
    while True:
        page = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()
        seqs = [int(e["seq"]) for e in page["events"]]
        if seqs and not page["has_more"] and seqs[-1] >= page["last_seq"]:
            return
        assert time.monotonic() < deadline, page
        time.sleep(0.2)


def _task_while_down(
    stack: Stack, http: httpx.Client, service: str
) -> tuple[str, dict[str, Any], float]:
    """A task created while `service` is killed: its id, its view once it ended, and how long
    that took. The service is started again (and ready) before this returns."""
    stack.kill_service(service)
    try:
        started = time.monotonic()
        task_id = _create(http, f"{service} is down")
        view = wait_for_state(
            http, task_id, "ERROR", "FINISHED", timeout_s=AGENT_DEADLINE_S * 4 + 30
        )
        return task_id, view, time.monotonic() - started
    finally:
        stack.start_service(service)
        stack.wait_ready((service,))


def test_a_step_nobody_answers_ends_in_error_naming_the_reasoner(
    stack: Stack, http: httpx.Client
) -> None:
    task_id, view, waited = _task_while_down(stack, http, "reasoner")
    assert view["state"] == "ERROR"
    assert view["reason"].startswith("no answer from the reasoner")
    assert "after 2 requests" in view["reason"]
    assert waited >= 2 * AGENT_DEADLINE_S  # asked, asked again, then gave up
    _say(http, task_id, "the reasoner is back: go on")
    assert (
        wait_for_state(http, task_id, "FINISHED", timeout_s=60)["result"]["final_message"] == "done"
    )


def test_a_step_dead_lettered_while_storage_is_down_ends_in_error_at_once(
    stack: Stack, http: httpx.Client
) -> None:
    """A step request carries the entries the reasoner has not seen, so a running reasoner
    needs no storage. A new reasoner replica (here: restarted) needs the task's history from
    storage: with storage down its step is dead-lettered and the task ends in ERROR at once."""
    task_id = _create(http, "storage goes down")
    wait_for_state(http, task_id, "FINISHED")
    _stored(http, task_id)  # what storage must give the new reasoner once it is back
    stack.kill_service("storage")
    try:
        stack.kill_service("reasoner")
        stack.start_service("reasoner")
        stack.wait_ready(("reasoner",))
        started = time.monotonic()
        _say(http, task_id, "go on without storage")
        view = wait_for_state(http, task_id, "ERROR", timeout_s=AGENT_DEADLINE_S * 4 + 30)
        waited = time.monotonic() - started
    finally:
        stack.start_service("storage")
        stack.wait_ready(("storage",))
    assert view["reason"].startswith("the reasoner (the agent's next step) gave up"), view
    assert waited < 2 * AGENT_DEADLINE_S  # the dead letter, not the deadline, ended it
    _say(http, task_id, "storage is back: go on")
    assert (
        wait_for_state(http, task_id, "FINISHED", timeout_s=60)["result"]["final_message"] == "done"
    )


def test_a_log_past_2_mb_keeps_stepping_and_pages_through_events(http: httpx.Client) -> None:
    task_id = _create(http, "a long conversation")
    steps = wait_for_state(http, task_id, "FINISHED")["iterations"]
    message = "x" * 190_000
    for i in range(12):  # about 2.3 MB of user messages, each answered (the history read whole)
        _say(http, task_id, f"{i} {message}")
        deadline = time.monotonic() + 60
        while (view := http.get(f"/v1/tasks/{task_id}").json())["iterations"] == steps:
            assert time.monotonic() < deadline, view
            time.sleep(0.2)
        steps = wait_for_state(http, task_id, "FINISHED")["iterations"]
        assert view["state"] != "ERROR", view

    events: list[dict[str, Any]] = []
    after, pages, largest = 0, 0, 0
    while True:
        page = http.get(f"/v1/tasks/{task_id}/events", params={"after": after, "limit": 10_000})
        assert page.status_code == 200, page.text
        largest = max(largest, len(page.content))
        body = page.json()
        events += body["events"]
        pages += 1
        if not body["has_more"]:
            break
        after = body["next_after"]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))  # gap-free
    assert sum(len(e.get("content") or "") for e in events) > 2_000_000
    assert pages >= 3 and largest < 1 << 20  # each page below a NATS message
