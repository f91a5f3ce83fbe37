"""The security suite attacks a whole running system from outside, as a client would: every
service a process of its own on real NATS, Redis and Docker, the LLM the scripted server
(scripts/). Two tenants, `alpha` (the victim) and `beta` (the attacker), each with an API key
made through the admin API."""

from __future__ import annotations

import io
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.api_access import auth_headers, issue_key, set_limits
from tools.egress_ca import new_ca
from tools.stack import Stack, StackConfig, running

SCRIPT = Path(__file__).parent / "scripts" / "tenants.json"


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The CA of the suite's HTTPS test servers (test_egress.py): the egress proxy trusts it for
    # the hosts where it ends TLS to add a secret; sandboxes do not.
    upstream = Path(tmp_path_factory.mktemp("upstream-ca"))
    both, cert = new_ca("security suite upstream CA")
    (upstream / "ca.pem").write_bytes(both)
    (upstream / "ca.crt").write_bytes(cert)
    config = StackConfig.isolated(
        Path(tmp_path_factory.mktemp("security")),
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            # The scripted model has no list price: give it one, so that budgets can be spent.
            "DECKHANDS_LLM_INPUT_COST_PER_TOKEN": "0.000001",
            "DECKHANDS_LLM_OUTPUT_COST_PER_TOKEN": "0.000002",
            # An ended task's sandbox is removed at once (not kept for its workspace): the
            # suite checks that a stopped task has none an order could reach.
            "DECKHANDS_WORKSPACE_RETENTION_S": "0",
            # Egress policies (issue 27, test_egress.py): any public host, and 127.0.0.2, where
            # the suite's "outside" test servers listen (a private address needs its own rule).
            "DECKHANDS_EGRESS_ALLOW": '["*", "127.0.0.2/32"]',
            "DECKHANDS_EGRESS_UPSTREAM_CA_FILE": str(upstream / "ca.crt"),
        },
    )
    with running(config) as stack:
        yield stack


@dataclass
class Tenant:
    """One tenant's client, and what a test asks of the system on its behalf."""

    name: str
    key: str
    http: httpx.Client

    def create(self, **body: Any) -> str:
        answer = self.http.post("/v1/tasks", json=body)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def view(self, task_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def wait(self, task_id: str, *states: str, timeout_s: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        view = self.view(task_id)
        while view["state"] not in states:
            assert time.monotonic() < deadline, f"{task_id} never reached {states}: {view}"
            time.sleep(0.2)
            view = self.view(task_id)
        return view

    def log(self, task_id: str) -> list[dict[str, Any]]:
        answer = self.http.get(f"/v1/tasks/{task_id}/trajectory")
        assert answer.status_code == 200, answer.text
        return list(answer.json()["events"])


def _tenant(stack: Stack, name: str, **limits: Any) -> Iterator[Tenant]:
    key = issue_key(stack.config.gateway_url, stack.admin_api_key, name, name="security suite")
    if limits:
        set_limits(stack.config.gateway_url, stack.admin_api_key, name, **limits)
    with httpx.Client(
        base_url=stack.config.gateway_url, headers=auth_headers(key), timeout=30
    ) as http:
        yield Tenant(name, key, http)


@pytest.fixture(scope="session")
def alpha(stack: Stack) -> Iterator[Tenant]:
    yield from _tenant(stack, "alpha")


@pytest.fixture(scope="session")
def beta(stack: Stack) -> Iterator[Tenant]:
    yield from _tenant(stack, "beta")


@pytest.fixture
def anonymous(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.config.gateway_url, timeout=30) as http:
        yield http


@pytest.fixture
def llm_requests(stack: Stack) -> Any:
    """The scripted LLM's count of chat requests per task text: what an agent did."""

    def count(task: str) -> int:
        stats = httpx.get(f"http://127.0.0.1:{stack.config.llm_port}/stats", timeout=10).json()
        return int(stats["tasks"].get(task, 0))

    return count


@pytest.fixture
def new_tenant(stack: Stack) -> Iterator[Any]:
    """Make a tenant of the test's own, with the limits given (the admin's PUT .../limits)."""
    made: list[Iterator[Tenant]] = []

    def make(**limits: Any) -> Tenant:
        tenants = _tenant(stack, f"t-{uuid.uuid4().hex[:10]}", **limits)
        made.append(tenants)
        return next(tenants)

    yield make
    for tenants in made:
        tenants.close()


def tar(files: dict[str, bytes]) -> bytes:
    """A plain tar of `files` ({name: bytes}), as a client uploads one."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
