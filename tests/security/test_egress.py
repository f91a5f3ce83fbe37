"""Issue 27, from outside on the whole running system: a task's sandbox reaches the network only
through the egress proxy, and only the hosts its policy names; the operator's bound holds at the
API. The agent's own commands (the scripted LLM's `egress-fetch:` conversation) fetch each URL
with every host sent through the proxy (NO_PROXY cleared), so that the proxy is what refuses.

The allowed host is a test server on 127.0.0.2 (loopback the sandbox's NO_PROXY does not name),
which the stack's bound grants by address (a private address needs that). A listener beside it
counts the connections a refused fetch might have made; NATS, Redis and the gateway are this
stack's own."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Tenant
from http_site import OUTSIDE, serving  # type: ignore[import-not-found]
from net_listener import Listener  # type: ignore[import-not-found]

from tools.stack import Stack

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = Path(tmp_path_factory.mktemp("site"))
    (root / "hello.txt").write_text("hello-from-the-allowed-host")
    with serving(root) as address:
        yield address


@pytest.fixture
def elsewhere() -> Iterator[Listener]:
    listener = Listener(OUTSIDE, banner=b"INFO elsewhere-banner\r\n")
    yield listener
    listener.close()


def _fetch(tenant: Tenant, allow: list[str], *urls: str) -> dict[str, str]:
    """Each URL's line of what the agent's fetch printed, and the task's log as text."""
    task_id = tenant.create(task=f"egress-fetch: {' '.join(urls)}", network={"allow": allow})
    view = tenant.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    assert view["network"] == {"allow": allow}, view
    output = view["result"]["final_message"].removeprefix("fetched: ")
    lines = {url: line for url in urls for line in output.splitlines() if line.startswith(url)}
    assert set(lines) == set(urls), output
    return lines | {"log": str(tenant.log(task_id)), "task_id": task_id}


def _connections(tenant: Tenant, task_id: str, at_least: int) -> list[dict[str, Any]]:
    """The egress proxy's account of the task's connections, in its log (sent each second)."""
    deadline = time.monotonic() + 15
    while True:
        seen = [
            c
            for e in tenant.log(task_id)
            if e["kind"] == "egress_activity"
            for c in e["connections"]
        ]
        if len(seen) >= at_least or time.monotonic() > deadline:
            return seen
        time.sleep(0.3)


def test_a_task_reaches_only_the_hosts_its_policy_names(
    alpha: Tenant, stack: Stack, site: str, elsewhere: Listener
) -> None:
    c = stack.config
    allowed = f"http://{site}/hello.txt"
    refused = [
        f"http://{OUTSIDE}:{elsewhere.port}/",  # the same address, another port
        f"http://127.0.0.1:{c.nats_port}/",
        f"http://127.0.0.1:{c.redis_port}/",
        f"http://127.0.0.1:{c.gateway_port}/healthz",
        f"http://localhost:{c.gateway_port}/healthz",  # a name of loopback
        "http://169.254.169.254/latest/meta-data/",  # the cloud's metadata address
        "https://pypi.org/simple/",  # a public host the policy does not name
    ]
    seen = _fetch(alpha, [site], allowed, *refused)
    assert "STATUS 200 hello-from-the-allowed-host" in seen[allowed], seen[allowed]
    for url in refused:
        assert "REFUSED" in seen[url] and "403" in seen[url], seen[url]
    assert "not in this task's network policy" in seen[refused[0]]
    # What a refused fetch would have quoted: nothing of the hosts behind the proxy.
    assert elsewhere.connections == 0
    for word in ("elsewhere-banner", "server_id", "-ERR", "NOAUTH"):
        assert word not in seen["log"]
    # The refusals are in the task's log, as the agent saw them.
    assert "deckhands egress proxy" in seen["log"]
    # ... and every connection, as the proxy saw it.
    connections = _connections(alpha, seen["task_id"], len(refused) + 1)
    reached = [(c["host"], c["port"]) for c in connections if c["allowed"]]
    host, port = site.rsplit(":", 1)
    assert reached == [(host, int(port))], connections
    assert next(c for c in connections if c["allowed"])["bytes_in"] > 0
    refusals = {(c["host"], c["reason"]) for c in connections if not c["allowed"]}
    assert ("169.254.169.254", "not_allowed") in refusals, connections
    assert ("pypi.org", "not_allowed") in refusals, connections
    assert len(connections) == len(refused) + 1, connections


def test_any_public_host_is_not_a_private_one(alpha: Tenant, stack: Stack) -> None:
    """`*` (the whole internet, within this stack's bound) reaches no private address, however
    written or named."""
    refused = [
        f"http://127.0.0.1:{stack.config.nats_port}/",
        f"http://localhost:{stack.config.redis_port}/",
        "http://169.254.169.254/latest/meta-data/",
        "http://2130706433/",  # 127.0.0.1 written as a number
    ]
    seen = _fetch(alpha, ["*"], *refused)
    for url in refused:
        assert "REFUSED" in seen[url] and "403" in seen[url], seen[url]


def test_a_policy_wider_than_the_bound_is_refused_naming_the_rule(
    alpha: Tenant, new_tenant: object
) -> None:
    wide = alpha.http.post(
        "/v1/tasks", json={"task": "finish", "network": {"allow": ["pypi.org", "10.0.0.0/8"]}}
    )
    assert wide.status_code == 422 and "10.0.0.0/8" in wide.text, wide.text
    bad = alpha.http.post("/v1/tasks", json={"task": "finish", "network": {"allow": ["a b"]}})
    assert bad.status_code == 422 and "a b" in bad.text, bad.text
    # A tenant's own bound, narrower than the deployment's.
    narrow = new_tenant(egress_allow=[f"{OUTSIDE}/32"])  # type: ignore[operator]
    outside = narrow.http.post(
        "/v1/tasks", json={"task": f"finish {uuid.uuid4().hex}", "network": {"allow": ["*"]}}
    )
    assert outside.status_code == 422 and "*" in outside.text, outside.text
