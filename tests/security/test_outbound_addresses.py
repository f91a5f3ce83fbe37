"""Issue 24, finding 4 and the webhook part of 6, from outside on the whole running system: the
connections made on a tenant's behalf (a repository's fetch by the runtime, a webhook's POST by
the gateway) reach no internal address, however the address is written or named, and a failed
fetch's reason says what failed, never what answered.

Before: a repository on 127.0.0.1 was cloned by the runtime on its own host, and the task's
ERROR reason quoted the remote (`bad line length character: INFO` from NATS, `Empty reply from
server` from Redis, `Couldn't connect` on a closed port): a port scanner of the task API. And a
webhook host whose first lookup failed was sent to unpinned.

Each attack watches a TCP listener this test starts on loopback (IPv4 and IPv6): none of them
may see a connection. A name that resolves to loopback is this machine's own host name when its
/etc/hosts says so (Debian's usual 127.0.1.1, or 127.0.0.1); the runtime's resolve-and-check
with a name is also covered with an injected resolver (tests/integration/runtime/
test_checkout_fetch.py), and a failed webhook lookup end to end by
tests/unit/gateway/test_gateway_webhook_rules.py."""

from __future__ import annotations

import ipaddress
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Tenant
from net_listener import Listener  # type: ignore[import-not-found]

from tools.procs import free_port
from tools.stack import Stack

pytestmark = pytest.mark.docker

# What the runtime's and the gateway's refusals say (services/runtime/checkout.py).
POLICY = "refused by the address policy"
NAME_REFUSED = (
    "the repository could not be fetched: host not found or refused by the address policy"
)
# What the remotes answered before, and git's words about them: in no reason, event or view.
REMOTE_WORDS = (
    "INFO",
    "server_id",
    "bad line length",
    "Empty reply",
    "Couldn't connect",
    "Connection refused",
    "HTTP/0.9",
    "fatal:",
    "unable to access",
    "errno",
)


@pytest.fixture
def v4() -> Iterator[Listener]:
    listener = Listener("127.0.0.1", banner=b'INFO {"server_id":"listener"}\r\n')
    yield listener
    listener.close()


@pytest.fixture
def v6() -> Iterator[Listener | None]:
    try:
        listener = Listener("::1", banner=b'INFO {"server_id":"listener"}\r\n')
    except OSError:
        yield None  # no IPv6 loopback here
        return
    yield listener
    listener.close()


def _loopback_name() -> str | None:
    """A name this machine resolves to loopback without a DNS server: its own host name, when
    /etc/hosts says so; None when it does not."""
    name = socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)
    except OSError:
        return None
    addresses = {str(info[4][0]).split("%")[0] for info in infos}
    if addresses and all(ipaddress.ip_address(a).is_loopback for a in addresses):
        return name
    return None


def _nats_port(stack: Stack) -> int:
    return int(stack.config.nats_url.split(",")[0].rsplit(":", 1)[1])


def _no_remote_words(text: str) -> None:
    for words in REMOTE_WORDS:
        assert words not in text, f"{words!r} in {text[:2000]}"


def test_repositories_on_internal_literals_are_refused_when_posted(
    alpha: Tenant, stack: Stack, v4: Listener, v6: Listener | None
) -> None:
    nats, redis, gateway = _nats_port(stack), stack.config.redis_port, stack.config.gateway_port
    closed = free_port()
    port = v4.port
    urls = [
        *(f"http://127.0.0.1:{p}/x.git" for p in (nats, redis, closed, gateway, port)),
        f"git://127.0.0.1:{nats}/x",
        f"https://127.0.0.1:{port}/x.git",
        f"http://localhost:{port}/x.git",
        f"http://LOCALHOST.:{port}/x.git",
        f"http://api.localhost:{port}/x.git",
        f"http://ip6-localhost:{port}/x.git",
        f"http://[::1]:{v6.port if v6 else port}/x.git",
        f"git://[::1]:{v6.port if v6 else port}/x",
        f"http://0x7f000001:{port}/x.git",
        f"http://2130706433:{port}/x.git",
        f"http://0177.0.0.1:{port}/x.git",
        f"http://0x7f.1:{port}/x.git",
        f"http://127.1:{port}/x.git",
        f"http://127.0.0.1.:{port}/x.git",
        f"http://[::ffff:127.0.0.1]:{port}/x.git",
        f"http://[::ffff:7f00:1]:{port}/x.git",
        f"http://[64:ff9b::7f00:1]:{port}/x.git",
        f"http://[2002:7f00:1::]:{port}/x.git",
        "http://0.0.0.0/x.git",
        "http://10.0.0.1/x.git",
        "http://172.16.0.1/x.git",
        "http://192.168.1.1/x.git",
        "http://100.64.0.1/x.git",
        "http://100.100.100.200/latest/meta-data/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[fd00:ec2::254]/latest/meta-data/",
        "http://192.88.99.1/x.git",
        "http://198.18.0.1/x.git",
        "http://[fec0::1]/x.git",
        "http://[fe80::1]/x.git",
        "http://224.0.0.1/x.git",
    ]
    for url in urls:
        answer = alpha.http.post(
            "/v1/tasks", json={"task": "outbound-repo: literal", "repository": {"url": url}}
        )
        assert answer.status_code == 422, (url, answer.status_code, answer.text)
        assert "repository" in answer.text and POLICY in answer.text, (url, answer.text)
    time.sleep(1)  # anything that got through would be connecting by now
    assert v4.connections == 0
    assert v6 is None or v6.connections == 0


def test_a_name_resolving_to_loopback_is_refused_at_the_fetch_with_one_reason_for_every_port(
    alpha: Tenant, stack: Stack, v4: Listener
) -> None:
    name = _loopback_name()
    if name is None:
        pytest.skip("this machine's host name does not resolve to loopback (/etc/hosts)")
    nats, redis, gateway = _nats_port(stack), stack.config.redis_port, stack.config.gateway_port
    targets = {
        "nats": f"git://{name}:{nats}/x",
        "nats over http": f"http://{name}:{nats}/x.git",
        "redis": f"http://{name}:{redis}/x.git",
        "gateway": f"http://{name}:{gateway}/x.git",
        "closed port": f"http://{name}:{free_port()}/x.git",
        "listener": f"http://{name}:{v4.port}/x.git",
    }
    tasks = {
        what: alpha.create(task=f"outbound-repo: {what}", repository={"url": url})
        for what, url in targets.items()
    }
    reasons = {}
    for what, task_id in tasks.items():
        view = alpha.wait(task_id, "ERROR", "FINISHED", timeout_s=180)
        assert view["state"] == "ERROR", (what, view)
        reasons[what] = view["reason"]
        _no_remote_words(json.dumps(view))
        _no_remote_words(json.dumps(alpha.log(task_id)))
    # One reason whatever listens there (or nothing does): no port scanner.
    assert len(set(reasons.values())) == 1, reasons
    assert NAME_REFUSED in reasons["listener"], reasons
    assert v4.connections == 0


def _signing_secret(tenant: Tenant) -> None:
    answer = tenant.http.put("/v1/secrets/OUTBOUND_HOOK_KEY", json={"value": "k" * 32})
    assert answer.status_code in (200, 201), answer.text


def _attempts(tenant: Tenant, task_id: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = tenant.http.get(f"/v1/tasks/{task_id}/webhooks")
        assert answer.status_code == 200, answer.text
        attempts: list[dict[str, Any]] = answer.json()["attempts"]
        if attempts:
            return attempts
        assert time.monotonic() < deadline, f"no webhook attempt for {task_id}"
        time.sleep(0.3)


def test_webhooks_to_internal_literals_are_refused_when_given(alpha: Tenant, v4: Listener) -> None:
    _signing_secret(alpha)
    port = v4.port
    for url in (
        f"http://127.0.0.1:{port}/in",
        f"http://2130706433:{port}/in",
        f"http://0x7f.1:{port}/in",
        f"http://127.1:{port}/in",
        f"http://localhost.:{port}/in",
        f"http://[::ffff:127.0.0.1]:{port}/in",
        "http://100.64.0.1/in",
        "http://169.254.169.254/in",
        "http://192.88.99.1/in",
        "http://[fec0::1]/in",
        "http://[2002:7f00:1::]/in",
        "http://[fd00:ec2::254]/in",
    ):
        hook = {"url": url, "signing_secret": "OUTBOUND_HOOK_KEY"}
        task = alpha.http.post("/v1/tasks", json={"task": "outbound-hook: x", "webhook": hook})
        assert task.status_code == 422, (url, task.text)
        default = alpha.http.put("/v1/webhook", json=hook)
        assert default.status_code == 422, (url, default.text)
    time.sleep(1)
    assert v4.connections == 0


def test_a_webhook_name_resolving_to_loopback_is_refused_at_delivery(
    alpha: Tenant, v4: Listener
) -> None:
    name = _loopback_name()
    if name is None:
        pytest.skip("this machine's host name does not resolve to loopback (/etc/hosts)")
    _signing_secret(alpha)
    hook = {"url": f"http://{name}:{v4.port}/in", "signing_secret": "OUTBOUND_HOOK_KEY"}
    task_id = alpha.create(task="outbound-hook: to a name on loopback", webhook=hook)
    alpha.wait(task_id, "FINISHED", "ERROR")
    [attempt] = _attempts(alpha, task_id)
    assert attempt["outcome"] == "gave_up" and attempt["status_code"] is None, attempt
    assert "target refused" in attempt["error"] and "loopback" in attempt["error"], attempt
    assert v4.connections == 0


def test_a_webhook_whose_lookup_fails_sends_nothing_and_tries_again(alpha: Tenant) -> None:
    """From outside, a lookup that fails (`.invalid` never resolves) is an attempt recorded as
    not sent and retried, not a request handed to an HTTP client that would look the name up
    again itself, unchecked (the rebinding half of it: the unit test's injected resolver)."""
    _signing_secret(alpha)
    hook = {"url": "http://hooks.invalid/in", "signing_secret": "OUTBOUND_HOOK_KEY"}
    task_id = alpha.create(task="outbound-hook: to a name that does not resolve", webhook=hook)
    try:
        alpha.wait(task_id, "FINISHED", "ERROR")
        first = _attempts(alpha, task_id)[0]
        assert first["outcome"] == "retrying" and first["status_code"] is None, first
        assert first["error"].startswith("not sent:") and "did not resolve" in first["error"]
    finally:
        # The retries end with the task (a delivery for a deleted task is dropped).
        alpha.http.delete(f"/v1/tasks/{task_id}")
