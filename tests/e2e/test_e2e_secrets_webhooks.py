"""Issue 11, parts 3 and 4, through the real stack: every service a separate process, real NATS,
Redis and Docker, the LLM the scripted server (tests/e2e/scripts/secrets_webhooks.json), and a
webhook receiver on loopback (which the operator allows here: DECKHANDS_WEBHOOK_ALLOW_PRIVATE_
TARGETS).

- secrets: set, listed by name, deleted; no answer ever carries a value; a task naming an
  unknown secret is refused naming it;
- a task whose command echoes its secret: the observation, the log (events and trajectory) and
  every service's log file show `<secret:NAME>`, never the value;
- webhooks: a FINISHED body signed as docs/tenants.md ("Webhooks") says; a receiver failing
  twice gets the notification on the third attempt, the delivery log showing all three; a
  gateway killed between attempts does not lose the notification;
- a Redis that lost its data (FLUSHALL): the secrets and the tenant's default webhook are put
  back from NATS key-value, and a task uses them as before.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from e2e_helpers import Receiver, create_task, verify_signature, wait_for_state  # type: ignore[import-not-found]

from tools.api_access import auth_headers, issue_key
from tools.stack import Stack, StackConfig, running

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).parent / "scripts" / "secrets_webhooks.json"
SIGNING_KEY = "whsec-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("secrets-webhooks"))
    config = StackConfig.isolated(
        run_dir,
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            "DECKHANDS_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",  # the receiver is on loopback
            "DECKHANDS_WEBHOOK_BACKOFF_S": "2",
            "DECKHANDS_WEBHOOK_TIMEOUT_S": "5",
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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made: list[Receiver] = []

    def make(failures: int = 0) -> Receiver:
        made.append(Receiver(failures))
        return made[-1]

    yield make  # type: ignore[misc]
    for r in made:
        r.close()


def _attempts(http: httpx.Client, task_id: str, count: int, timeout_s: float = 60) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    attempts: list[Any] = []
    while time.monotonic() < deadline:
        answer = http.get(f"/v1/tasks/{task_id}/webhooks")
        assert answer.status_code == 200, answer.text
        attempts = answer.json()["attempts"]
        if len(attempts) >= count and attempts[-1]["outcome"] != "retrying":
            return attempts
        time.sleep(0.2)
    raise AssertionError(f"task {task_id}: delivery log {attempts}")


def _signing_key(http: httpx.Client) -> None:
    answer = http.put("/v1/secrets/WEBHOOK_KEY", json={"value": SIGNING_KEY})
    assert answer.status_code in (200, 201), answer.text


def test_secrets_are_set_listed_and_deleted_and_never_shown(
    stack: Stack, http: httpx.Client
) -> None:
    value = "tok-" + uuid.uuid4().hex
    created = http.put("/v1/secrets/CRUD_TOKEN", json={"value": value})
    assert created.status_code == 201, created.text
    assert created.json()["name"] == "CRUD_TOKEN" and value not in created.text
    again = http.put("/v1/secrets/CRUD_TOKEN", json={"value": value + "2"})
    assert again.status_code == 200 and value not in again.text
    listed = http.get("/v1/secrets")
    assert listed.status_code == 200
    assert "CRUD_TOKEN" in [s["name"] for s in listed.json()["secrets"]]
    assert value not in listed.text

    # Another tenant sees none of it.
    other = issue_key(stack.config.gateway_url, stack.admin_api_key, "other-tenant")
    theirs = http.get("/v1/secrets", headers=auth_headers(other))
    assert "CRUD_TOKEN" not in theirs.text
    assert http.delete("/v1/secrets/CRUD_TOKEN", headers=auth_headers(other)).status_code == 404

    # Bad names and values are refused, naming the problem.
    bad = http.put("/v1/secrets/PATH", json={"value": "whatever"})
    assert bad.status_code == 422 and "reserved" in bad.text
    short = http.put("/v1/secrets/SHORT_ONE", json={"value": "abc"})
    assert short.status_code == 422 and "at least 4" in short.text
    invalid = http.put("/v1/secrets/1-bad", json={"value": "whatever"})
    assert invalid.status_code == 422

    # A task naming a secret the tenant lacks: refused, naming it; nothing created.
    refused = http.post("/v1/tasks", json={"task": "finish now", "secrets": ["NOPE_TOKEN"]})
    assert refused.status_code == 422 and "NOPE_TOKEN" in refused.text

    assert http.delete("/v1/secrets/CRUD_TOKEN").status_code == 204
    assert http.delete("/v1/secrets/CRUD_TOKEN").status_code == 404
    assert "CRUD_TOKEN" not in http.get("/v1/secrets").text


def test_a_secret_reaches_the_command_and_never_the_log(stack: Stack, http: httpx.Client) -> None:
    value = "s3cr3t-" + uuid.uuid4().hex
    assert http.put("/v1/secrets/API_TOKEN", json={"value": value}).status_code in (200, 201)
    task_id = create_task(http, task="use the token", secrets=["API_TOKEN"])
    view = wait_for_state(http, task_id, "FINISHED", "ERROR")
    assert view["state"] == "FINISHED", view

    events = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
    trajectory = http.get(f"/v1/tasks/{task_id}/trajectory")
    assert trajectory.status_code == 200
    run = next(e for e in events if e["kind"] == "run_output")
    # The command had the value in its environment: it printed it, redacted at the source.
    assert run["content"].strip() == "the token is <secret:API_TOKEN>", run
    read = next(e for e in events if e["kind"] == "read_output")
    assert "<secret:API_TOKEN>" in read["content"], read
    cell = next(e for e in events if e["kind"] == "python_output")
    assert cell["content"].strip() == "python sees <secret:API_TOKEN>", cell
    assert "<secret:API_TOKEN>" in view["result"]["final_message"]
    for where, text in (
        ("events", json.dumps(events)),
        ("trajectory", trajectory.text),
        ("task", json.dumps(view)),
    ):
        assert value not in text, f"the secret's value is in the {where}"
    for log_file in stack.logs.glob("*.log"):
        assert value not in log_file.read_text(errors="replace"), f"value in {log_file.name}"


def test_a_whole_output_kept_as_a_blob_is_redacted_too(http: httpx.Client) -> None:
    value = "blob-" + uuid.uuid4().hex
    assert http.put("/v1/secrets/API_TOKEN", json={"value": value}).is_success
    task_id = create_task(http, task="long output", secrets=["API_TOKEN"])
    assert wait_for_state(http, task_id, "FINISHED", "ERROR")["state"] == "FINISHED"
    events = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
    run = next(e for e in events if e["kind"] == "run_output")
    ref = run["content_ref"]
    assert ref is not None, "the output was not long enough to be kept whole"
    blob = http.get(f"/v1/tasks/{task_id}/blobs/{ref['sha256']}")
    assert blob.status_code == 200
    assert blob.text.count("token=<secret:API_TOKEN>") == 4000
    assert value not in blob.text and value not in json.dumps(events)


def test_a_finished_task_posts_a_signed_body(http: httpx.Client, receiver: Any) -> None:
    _signing_key(http)
    hook = receiver()
    task_id = create_task(
        http, task="finish now", webhook={"url": hook.url, "signing_secret": "WEBHOOK_KEY"}
    )
    wait_for_state(http, task_id, "FINISHED")
    hook.wait_for(1)
    headers, body, _, _ = hook.requests[0]
    assert verify_signature(SIGNING_KEY, headers["Deckhands-Signature"], body)
    assert not verify_signature("another-key", headers["Deckhands-Signature"], body)
    payload = json.loads(body)
    assert payload["type"] == "task.finished"
    assert payload["task"]["id"] == task_id and payload["task"]["state"] == "FINISHED"
    assert payload["task"]["final_message"] == "done at once"
    assert headers["Deckhands-Delivery-Id"] == payload["id"]
    attempts = _attempts(http, task_id, 1)
    assert [(a["attempt"], a["status_code"], a["outcome"]) for a in attempts] == [
        (1, 200, "delivered")
    ]
    time.sleep(1.0)
    assert len(hook.requests) == 1  # delivered once


def test_another_tenant_sees_no_delivery_log(stack: Stack, http: httpx.Client) -> None:
    task_id = create_task(http, task="finish now")
    other = issue_key(stack.config.gateway_url, stack.admin_api_key, "other-tenant")
    theirs = http.get(f"/v1/tasks/{task_id}/webhooks", headers=auth_headers(other))
    assert theirs.status_code == 404
    assert theirs.json()["detail"] == f"task {task_id!r} not found"
    assert http.get(f"/v1/tasks/{task_id}/webhooks").json()["webhook"] is None


def test_a_failing_receiver_gets_it_after_retries(http: httpx.Client, receiver: Any) -> None:
    _signing_key(http)
    hook = receiver(failures=2)
    task_id = create_task(
        http, task="finish now", webhook={"url": hook.url, "signing_secret": "WEBHOOK_KEY"}
    )
    wait_for_state(http, task_id, "FINISHED")
    hook.wait_for(3)
    attempts = _attempts(http, task_id, 3)
    assert [(a["attempt"], a["status_code"], a["outcome"]) for a in attempts] == [
        (1, 500, "retrying"),
        (2, 500, "retrying"),
        (3, 200, "delivered"),
    ]
    ids = {headers["Deckhands-Delivery-Id"] for headers, _, _, _ in hook.requests}
    assert len(ids) == 1  # one notification, the same idempotency id on every attempt
    for headers, body, _, _ in hook.requests:
        assert verify_signature(SIGNING_KEY, headers["Deckhands-Signature"], body)
    # The second delay is about twice the first (2 s, then 4 s, with up to 10% jitter).
    assert 2.0 <= attempts[0]["next_attempt_in_s"] <= 2.2
    assert 4.0 <= attempts[1]["next_attempt_in_s"] <= 4.4
    came = [at for _, _, _, at in hook.requests]
    assert came[1] - came[0] >= 1.9 and came[2] - came[1] >= 3.9


def test_a_tenant_default_webhook_and_refused_urls(http: httpx.Client, receiver: Any) -> None:
    _signing_key(http)
    hook = receiver()
    unknown = http.put("/v1/webhook", json={"url": hook.url, "signing_secret": "NO_SUCH_KEY"})
    assert unknown.status_code == 422 and "NO_SUCH_KEY" in unknown.text
    scheme = http.put("/v1/webhook", json={"url": "ftp://example.com/x", "signing_secret": "K"})
    assert scheme.status_code == 422
    put = http.put("/v1/webhook", json={"url": hook.url, "signing_secret": "WEBHOOK_KEY"})
    assert put.status_code == 200, put.text
    try:
        task_id = create_task(http, task="finish now")
        wait_for_state(http, task_id, "FINISHED")
        hook.wait_for(1)
        assert json.loads(hook.requests[0][1])["task"]["id"] == task_id
    finally:
        assert http.delete("/v1/webhook").status_code == 204
    assert http.get("/v1/webhook").json() == {"webhook": None}


def test_a_notification_survives_a_gateway_restart(
    stack: Stack, http: httpx.Client, receiver: Any
) -> None:
    _signing_key(http)
    hook = receiver(failures=1)
    task_id = create_task(
        http, task="finish now", webhook={"url": hook.url, "signing_secret": "WEBHOOK_KEY"}
    )
    wait_for_state(http, task_id, "FINISHED")
    hook.wait_for(1)  # the first attempt failed: the retry (in 2 s) waits in JetStream
    stack.kill_service("gateway")
    killed_at = time.monotonic()
    stack.start_service("gateway")
    hook.wait_for(2, timeout_s=90)
    assert hook.requests[1][3] > killed_at  # sent by the gateway started again
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if http.get("/readyz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    attempts = _attempts(http, task_id, 2)
    assert [a["outcome"] for a in attempts] == ["retrying", "delivered"]
    assert hook.requests[-1][2] == 200


def test_waiting_and_stopped_are_notified_when_asked_for(http: httpx.Client, receiver: Any) -> None:
    _signing_key(http)
    assert http.put("/v1/secrets/API_TOKEN", json={"value": "t-" + uuid.uuid4().hex}).is_success
    hook = receiver()
    task_id = create_task(
        http,
        task="use the token",
        secrets=["API_TOKEN"],
        confirmation_mode=True,
        confirmation_threshold="LOW",
        webhook={"url": hook.url, "signing_secret": "WEBHOOK_KEY", "on_waiting": True},
    )
    wait_for_state(http, task_id, "AWAITING_USER_CONFIRMATION")
    hook.wait_for(1)
    assert http.post(f"/v1/tasks/{task_id}/stop").status_code == 202
    wait_for_state(http, task_id, "STOPPED")
    hook.wait_for(2)
    types = [json.loads(body)["type"] for _, body, _, _ in hook.requests]
    assert types == ["task.awaiting_user_confirmation", "task.stopped"]
    ids = [headers["Deckhands-Delivery-Id"] for headers, _, _, _ in hook.requests]
    assert len(set(ids)) == 2  # two notifications, each its own id


def test_a_secret_typed_in_a_message_is_redacted_in_the_log(http: httpx.Client) -> None:
    value = "typed-" + uuid.uuid4().hex
    assert http.put("/v1/secrets/API_TOKEN", json={"value": value}).is_success
    task_id = create_task(http, task="finish now", secrets=["API_TOKEN"])
    wait_for_state(http, task_id, "FINISHED")
    sent = http.post(f"/v1/tasks/{task_id}/messages", json={"content": f"also use {value}"})
    assert sent.status_code == 202, sent.text
    deadline = time.monotonic() + 60
    messages: list[str] = []
    while time.monotonic() < deadline:
        events = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
        messages = [e["content"] for e in events if e["kind"] == "message"]
        if any("also use" in m for m in messages):
            break
        time.sleep(0.2)
    assert "also use <secret:API_TOKEN>" in messages, messages
    assert value not in json.dumps(events)


def test_secrets_and_webhooks_outlive_a_redis_that_lost_its_data(
    stack: Stack, http: httpx.Client, receiver: Any
) -> None:
    """Run last: FLUSHALL. The gateway fills Redis again from the NATS key-value bucket."""
    value = "durable-" + uuid.uuid4().hex
    assert http.put("/v1/secrets/API_TOKEN", json={"value": value}).status_code in (200, 201)
    _signing_key(http)
    hook = receiver()
    webhook = {"url": hook.url, "signing_secret": "WEBHOOK_KEY"}
    assert http.put("/v1/webhook", json=webhook).status_code == 200
    try:
        admin = redis.Redis(**stack.redis_login("admin"), socket_timeout=10)
        try:
            admin.flushall()
        finally:
            admin.close()
        deadline = time.monotonic() + 60
        names: list[str] = []
        while time.monotonic() < deadline:
            answer = http.get("/v1/secrets")
            if answer.status_code == 200:
                names = [s["name"] for s in answer.json()["secrets"]]
                if "API_TOKEN" in names:
                    break
            time.sleep(0.5)
        assert "API_TOKEN" in names and "WEBHOOK_KEY" in names, names
        assert http.get("/v1/webhook").json() == {"webhook": webhook | {"on_waiting": False}}

        task_id = create_task(http, task="use the token", secrets=["API_TOKEN"])
        view = wait_for_state(http, task_id, "FINISHED", "ERROR")
        assert view["state"] == "FINISHED", view
        events = http.get(f"/v1/tasks/{task_id}/events", params={"after": 0}).json()["events"]
        run = next(e for e in events if e["kind"] == "run_output")
        assert run["content"].strip() == "the token is <secret:API_TOKEN>", run
        assert value not in json.dumps(events)
        hook.wait_for(1)
        assert json.loads(hook.requests[0][1])["task"]["id"] == task_id
    finally:
        http.delete("/v1/webhook")
