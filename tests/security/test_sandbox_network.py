"""A task without a network policy reaches nothing, from outside on the whole running system.

Its sandbox is created with networking disabled (services/runtime/isolation.py, OFFLINE): an
empty network namespace with only `lo`. A hostile agent tries the stack's own servers (the
gateway, NATS and Redis, listening on the host's loopback), a listener of the test's on every
address of the host, and the host's other addresses (the engine's bridge): every connection
must fail, and the listener must see none.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from conftest import Tenant
from net_listener import Listener  # type: ignore[import-not-found]

from tools.stack import Stack

pytestmark = pytest.mark.docker


@pytest.fixture
def everywhere() -> Iterator[Listener]:
    listener = Listener("0.0.0.0", banner=b"HELLO from the host\r\n")
    yield listener
    listener.close()


def _host_addresses() -> list[str]:
    """The host's own IPv4 addresses but loopback's (every interface's, from the kernel's
    table of local addresses)."""
    with open("/proc/net/fib_trie") as trie:
        lines = trie.read().splitlines()
    local = {
        before.split()[-1] for before, line in itertools.pairwise(lines) if "/32 host LOCAL" in line
    }
    return sorted(a for a in local if not a.startswith("127."))


def test_a_task_without_a_policy_reaches_neither_the_stack_nor_the_host(
    alpha: Tenant, stack: Stack, everywhere: Listener
) -> None:
    c = stack.config
    targets = [
        f"127.0.0.1:{c.gateway_port}",
        f"127.0.0.1:{c.nats_port}",
        f"127.0.0.1:{c.redis_port}",
        f"127.0.0.1:{everywhere.port}",
        *(f"{address}:{everywhere.port}" for address in _host_addresses()),
    ]
    task_id = alpha.create(task="reach-out: " + " ".join(targets))
    view = alpha.wait(task_id, "FINISHED", "ERROR", timeout_s=120)
    assert view["state"] == "FINISHED", view
    lines = view["result"]["final_message"].removeprefix("reached: ").strip().splitlines()
    assert lines[0].split() == ["lo"], lines  # no interface but its own loopback
    verdicts = {
        line.split()[0]: line.split()[1]
        for line in lines[1:]
        if line.split() and line.split()[0] in targets
    }
    assert set(verdicts) == set(targets), lines
    assert set(verdicts.values()) == {"BLOCKED"}, lines
    assert everywhere.connections == 0
