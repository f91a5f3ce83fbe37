"""The seed task end to end: HTTP gateway → controller → reasoner (litellm → scripted LLM
server) → security → runtime (Docker sandbox) → storage, all as separate processes on real
nats-server, redis-server and the Docker engine."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.gateway.tenants.api_keys import key_prefix_of
from tools.api_access import auth_headers
from tools.run_task import SEED_TASK, run_task
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("stack"))
    config = StackConfig.isolated(
        run_dir,
        extra_env={"DECKHANDS_POOL_MIN_IDLE": "1"},
    )
    with running(config) as stack:
        yield stack


def test_seed_task_prints_the_squares_from_a_sandbox(stack: Stack) -> None:
    out = io.StringIO()
    result = run_task(
        stack.config.gateway_url, SEED_TASK, timeout_s=180, out=out, api_key=stack.api_key
    )
    transcript = out.getvalue()
    assert result["state"] == "FINISHED", transcript
    assert "10 squared is 100" in result["result"]["final_message"], transcript
    # The line came from the sandbox: the command's observation carries it too.
    assert "run_output" in transcript and "10 squared is 100" in transcript


def test_events_are_stored_in_order_and_bad_requests_are_named(stack: Stack) -> None:
    run = run_task(
        stack.config.gateway_url,
        SEED_TASK,
        timeout_s=180,
        out=io.StringIO(),
        api_key=stack.api_key,
    )
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
    ) as http:
        page = http.get(f"/v1/tasks/{run['id']}/events", params={"after": 0}).json()
        seqs = [e["seq"] for e in page["events"]]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 10
        later = http.get(f"/v1/tasks/{run['id']}/events", params={"after": 5}).json()
        assert [e["seq"] for e in later["events"]] == seqs[5:]

        missing = http.get("/v1/tasks/does-not-exist")
        assert missing.status_code == 404 and "not found" in missing.text
        no_task = http.post("/v1/tasks", json={"max_iterations": 3})
        assert no_task.status_code == 422 and "task" in no_task.text
        garbage = http.post(
            "/v1/tasks", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert garbage.status_code == 422


def test_the_stacks_api_key_is_kept_while_it_works_and_replaced_once_revoked(
    stack: Stack,
) -> None:
    key = stack.api_key
    stack.ensure_api_key()  # what a second `make up` does on the same data
    assert stack.api_key == key
    prefix = key_prefix_of(key)
    revoked = httpx.delete(
        f"{stack.config.gateway_url}/v1/admin/tenants/{stack.config.tenant}/keys/{prefix}",
        headers=auth_headers(stack.admin_api_key),
        timeout=30,
    )
    assert revoked.status_code == 200, revoked.text
    stack.ensure_api_key()
    assert stack.api_key != key
    assert (stack.api_key_file.stat().st_mode & 0o777) == 0o600
    assert (stack.admin_key_file.stat().st_mode & 0o777) == 0o600
    result = run_task(
        stack.config.gateway_url,
        SEED_TASK,
        timeout_s=180,
        out=io.StringIO(),
        api_key=stack.api_key,
    )
    assert result["state"] == "FINISHED"
