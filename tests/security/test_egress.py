"""Issue 27, from outside on the whole running system: a task's sandbox reaches the network only
through the egress proxy, and only the hosts its policy names; the operator's bound holds at the
API. The agent's own commands (the scripted LLM's `egress-fetch:` conversation) fetch each URL
with every host sent through the proxy (NO_PROXY cleared), so that the proxy is what refuses.

The allowed host is a test server on 127.0.0.2 (loopback the sandbox's NO_PROXY does not name),
which the stack's bound grants by address (a private address needs that). A listener beside it
counts the connections a refused fetch might have made; NATS, Redis and the gateway are this
stack's own."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import Tenant
from http_site import (  # type: ignore[import-not-found]
    OUTSIDE,
    STALLED,
    STALLED_SENT,
    STALLED_SIZE,
    resumed,
    serving,
)
from net_listener import Listener  # type: ignore[import-not-found]
from tls_site import TlsSite, tls_serving  # type: ignore[import-not-found]

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
    assert view["network"] == {"allow": allow, "between_actions": []}, view
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
    # Kept between actions (a background process's reach): only rules of the task's own.
    background = alpha.http.post(
        "/v1/tasks",
        json={
            "task": "finish",
            "network": {"allow": [f"{OUTSIDE}/32"], "between_actions": ["169.254.169.254"]},
        },
    )
    assert background.status_code == 422, background.text
    assert "between_actions" in background.text and "169.254.169.254" in background.text


# -- secrets added at the egress (issue 27, item 3)


@pytest.fixture(scope="module")
def redirect_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsSite]:
    """A plain-HTTP host, where the bound host's /redirect leads; its requests recorded."""
    with tls_serving(None, Path(tmp_path_factory.mktemp("redirected"))) as recorder:
        yield recorder


@pytest.fixture(scope="module")
def api_site(
    stack: Stack, tmp_path_factory: pytest.TempPathFactory, redirect_target: TlsSite
) -> Iterator[TlsSite]:
    """An HTTPS host a secret is bound to, with a certificate of the suite's upstream CA
    (which the proxy trusts and the sandbox does not)."""
    upstream = Path(stack.config.extra_env["DECKHANDS_EGRESS_UPSTREAM_CA_FILE"])
    with tls_serving(
        upstream.with_suffix(".pem").read_bytes(),
        Path(tmp_path_factory.mktemp("api")),
        f"http://{redirect_target.address}/echo",
    ) as site:
        yield site


def _bind(tenant: Tenant, name: str, value: str, **egress: Any) -> httpx.Response:
    return tenant.http.put(f"/v1/secrets/{name}", json={"value": value, "egress": egress})


def test_a_binding_that_could_leak_or_smuggle_is_refused(alpha: Tenant) -> None:
    for egress, why in (
        ({"hosts": ["*"]}, "not to `*`"),
        ({"hosts": ["api.example.com"], "header": "Host"}, "where a request goes"),
        ({"hosts": ["api.example.com"], "format": "no placeholder"}, "once"),
    ):
        answer = _bind(alpha, "BOUND_BAD", "value-" + uuid.uuid4().hex, **egress)
        assert answer.status_code == 422 and why in answer.text, answer.text
    # A value that would end its header and start another.
    smuggled = _bind(alpha, "BOUND_BAD", "v\r\nX-Injected: 1", hosts=["api.example.com"])
    assert smuggled.status_code == 422 and "control character" in smuggled.text
    assert "BOUND_BAD" not in alpha.http.get("/v1/secrets").text


def test_a_bound_secret_reaches_only_its_host_and_never_the_sandbox(
    alpha: Tenant, api_site: TlsSite, redirect_target: TlsSite
) -> None:
    token = "ghp-" + uuid.uuid4().hex
    bound = _bind(alpha, "GITHUB_TOKEN", token, hosts=[api_site.address], format="Bearer {}")
    assert bound.status_code in (200, 201) and token not in bound.text, bound.text
    listed = alpha.http.get("/v1/secrets").json()["secrets"]
    [shown] = [s for s in listed if s["name"] == "GITHUB_TOKEN"]
    assert shown["egress"]["hosts"] == [api_site.address], shown
    plain = alpha.http.put("/v1/secrets/PLAIN_TOKEN", json={"value": "plain-" + uuid.uuid4().hex})
    assert plain.status_code in (200, 201), plain.text

    echo, redirect = f"https://{api_site.address}/echo", f"https://{api_site.address}/redirect"
    allow = [api_site.address, redirect_target.address]
    task_id = alpha.create(
        task=f"egress-fetch: {echo} {redirect}",
        network={"allow": allow},
        secrets=["GITHUB_TOKEN", "PLAIN_TOKEN"],
    )
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    output = view["result"]["final_message"]
    # Its host got it as the header; what the host echoed was redacted before the sandbox.
    assert f"{echo} STATUS 200 seen: Bearer <secret:GITHUB_TOKEN>" in output, output
    assert f"Bearer {token}" in api_site.headers_seen("authorization")
    # The redirect to another host was followed without it.
    assert f"{redirect} STATUS 200 seen: -" in output, output
    assert redirect_target.requests and redirect_target.headers_seen("authorization") == []
    log = str(alpha.log(task_id))
    assert token not in log
    added = [c for c in _connections(alpha, task_id, 3) if c.get("secrets")]
    assert {tuple(c["secrets"]) for c in added} == {("GITHUB_TOKEN",)}, added

    # A hostile agent hunting for it: environments, its folder, its files. The unbound secret
    # is found (redacted in what it reports), the bound one nowhere.
    hunt = alpha.create(
        task="hunt-secrets:", network={"allow": allow}, secrets=["GITHUB_TOKEN", "PLAIN_TOKEN"]
    )
    found = alpha.wait(hunt, "FINISHED", "ERROR", timeout_s=120)["result"]["final_message"]
    assert "PLAIN_TOKEN=<secret:PLAIN_TOKEN>" in found, found
    assert "GITHUB_TOKEN" not in found and token not in found, found
    assert token not in str(alpha.log(hunt))


def test_past_its_egress_allowance_a_tenant_s_network_tasks_are_refused(
    new_tenant: Any, site: str
) -> None:
    """Issue 27, item 5: egress bytes per day are a quota like spend."""
    tenant = new_tenant(max_egress_bytes_per_day=1)  # the first byte uses it up
    seen = _fetch(tenant, [site], f"http://{site}/hello.txt")
    assert seen[f"http://{site}/hello.txt"], seen
    deadline = time.monotonic() + 15
    while tenant.http.get("/v1/quotas").json()["usage"]["egress_bytes_today"] < 1:
        assert time.monotonic() < deadline, "the proxies never counted the task's bytes"
        time.sleep(0.3)
    refused = tenant.http.post(
        "/v1/tasks", json={"task": "finish now", "network": {"allow": [site]}}
    )
    assert refused.status_code == 429, refused.text
    assert "max_egress_bytes_per_day" in refused.text and "bytes through the egress" in refused.text
    assert int(refused.headers["Retry-After"]) > 0
    # A task without a network policy does not use egress, and is not held to it.
    offline = tenant.http.post("/v1/tasks", json={"task": f"finish {uuid.uuid4().hex}"})
    assert offline.status_code == 202, offline.text


def test_a_process_left_in_the_background_reaches_nothing_after_its_action(
    alpha: Tenant, site: str
) -> None:
    """Issue 27, item 6: an agent starts a loop that fetches in the background (to send data
    out later, unwatched). While its action runs it reaches the policy's host; once the action
    ended, and during a later action that connects nowhere (`sleep`, `tail`), it is refused."""
    url = f"http://{site}/hello.txt"
    task_id = alpha.create(task=f"background-egress: {url}", network={"allow": [site]})
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    lines = view["result"]["final_message"].removeprefix("after: ").strip().splitlines()
    assert lines and not [line for line in lines if line.startswith("OK")], lines
    assert any(line.startswith("NO 403") for line in lines), lines
    log = alpha.log(task_id)
    started = [e for e in log if e["kind"] == "run" and "bg.py" in e.get("command", "")]
    assert started, "the background loop was never started"
    # The verdicts record each command's scope: none placed for the loop's (a python
    # program), nowhere for `sleep; tail`.
    scopes = [e.get("network_scope") for e in log if e["kind"] == "security_verdict"]
    assert None in scopes and [] in scopes, scopes


def test_a_download_left_running_ends_with_its_action_though_its_host_went_silent(
    alpha: Tenant, site: str
) -> None:
    """Issue 27, item 6, against a host that stops sending: an agent starts a large download in
    the background, and its action ends while the host has sent only part of the body (the
    proxy then waits for the host inside the kernel, services/egress/body_splice.py). Between
    actions the task reaches nothing: the download ends at once, not when the host next
    sends (which it does only once the task is over)."""
    url = f"http://{site}{STALLED}"
    resumed.clear()
    try:
        task_id = alpha.create(task=f"background-download: {url}", network={"allow": [site]})
        view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    finally:
        resumed.set()
    assert view["state"] == "FINISHED", view
    lines = view["result"]["final_message"].removeprefix("after: ").strip().splitlines()
    ended = [line.split() for line in lines if line.startswith("ENDED")]
    assert ended, lines  # still waiting, 3 s after its action ended: the defect
    assert int(ended[-1][1]) <= STALLED_SENT < STALLED_SIZE, lines


def test_a_python_cell_reaches_only_the_urls_it_writes(alpha: Tenant, site: str) -> None:
    """Issue 27, item 6, for a Python cell: the monitor scopes a cell that fetches a URL it
    writes to that URL's host, so a second address the cell builds as it runs (to send data
    out where the task's policy allows, unseen by a reviewer) is refused, and the verdict
    shows the scope."""
    url = f"http://{site}/hello.txt"
    task_id = alpha.create(task=f"{url}#cell-egress", network={"allow": [f"{OUTSIDE}/32"]})
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    lines = view["result"]["final_message"].removeprefix("cell: ").strip().splitlines()
    assert lines[0] == "OK 200", lines
    assert lines[1].startswith("NO HTTP Error 403"), lines
    log = alpha.log(task_id)
    scopes = [e.get("network_scope") for e in log if e["kind"] == "security_verdict"]
    assert [site] in scopes, scopes


def test_what_a_sandbox_passes_to_the_proxy_other_than_its_connection_is_not_taken(
    alpha: Tenant, site: str
) -> None:
    """The sandbox's relay passes each client's TCP connection to the egress proxy over a
    unix socket (services/egress/passed_sockets.py). The agent can reach that socket too, and
    passes what it likes: a file, a unix socket, five descriptors at once, a listening socket,
    one not connected, nothing. The proxy takes none of them (answers 0) and still serves the
    task's allowed host afterwards."""
    url = f"http://{site}/hello.txt"
    task_id = alpha.create(task=f"egress-handoff: {url}", network={"allow": [site]})
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    output = view["result"]["final_message"].removeprefix("handed: ")
    seen = dict(pair.split("=", 1) for pair in output.split() if "=" in pair)
    # Under gVisor the sandbox cannot even send a descriptor to the host (EINVAL); under runc
    # it can, and the proxy refuses each.
    passed = "unsent" if os.environ.get("DECKHANDS_DOCKER_RUNTIME") == "runsc" else "0"
    assert seen == {
        "file": passed,
        "unix": passed,
        "many": passed,
        "listening": passed,
        "unconnected": passed,
        "none": "0",
        "fetch": "200",
    }, output
