"""Seats shared fairly through the real services (separate processes, real NATS, Redis and
Docker): one tenant's flood does not hold another back, seats follow the operator's weights
while tenants queue, a tenant's interactive tasks go ahead of its batch ones, and a queued task's
place is shown with an estimate; SREs see each tenant's seats and waits."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from e2e_helpers import log_of  # type: ignore[import-not-found]

from shared.admission import seats_prefix
from tools.api_access import auth_headers, issue_key, set_limits
from tools.stack import Stack, StackConfig, running

pytestmark = pytest.mark.docker

SEATS = 4
ENDED = {"FINISHED", "ERROR", "STOPPED", "REJECTED"}


def _script() -> dict[str, Any]:
    turns = [
        {"tool": "execute_bash", "arguments": {"command": "sleep 0.5; echo one"}, "delay_s": 0.2},
        {"tool": "execute_bash", "arguments": {"command": "echo two"}, "delay_s": 0.2},
        {"tool": "finish", "arguments": {"message": "done"}},
    ]
    return {"model": "scripted", "turns": turns}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("fair-seats"))
    script = run_dir / "script.json"
    script.write_text(json.dumps(_script()))
    config = StackConfig.isolated(
        run_dir,
        llm_script=script,
        controllers=2,  # as deployed (deploy/k8s/base, `make up`)
        reasoners=2,
        extra_env={
            "DECKHANDS_MAX_SANDBOXES": str(SEATS),
            "DECKHANDS_POOL_MIN_IDLE": "2",
            "DECKHANDS_WORKSPACE_RETENTION_S": "0",
        },
    )
    with running(config) as stack:
        yield stack


class Tenant:
    def __init__(self, stack: Stack, name: str, **limits: Any) -> None:
        gateway = stack.config.gateway_url
        key = issue_key(gateway, stack.admin_api_key, name, name="fair seats")
        if limits:
            set_limits(gateway, stack.admin_api_key, name, **limits)
        self.name = name
        self.http = httpx.Client(base_url=gateway, headers=auth_headers(key), timeout=30)

    def post(self, count: int, **body: Any) -> list[str]:
        ids = []
        for i in range(count):
            answer = self.http.post("/v1/tasks", json={"task": f"{self.name} {i}", **body})
            assert answer.status_code == 202, answer.text
            ids.append(str(answer.json()["id"]))
        return ids

    def view(self, task_id: str) -> dict[str, Any]:
        answer = self.http.get(f"/v1/tasks/{task_id}")
        deadline = time.monotonic() + 60
        while answer.status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.3)  # being restored after a Redis loss
            answer = self.http.get(f"/v1/tasks/{task_id}")
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def finished_at(self, ids: list[str], timeout_s: float = 240) -> dict[str, float]:
        """When each task ended (seconds since the epoch), once all have; all FINISHED."""
        done: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while len(done) < len(ids):
            assert time.monotonic() < deadline, f"{len(ids) - len(done)} tasks did not end"
            for task_id in [t for t in ids if t not in done]:
                view = self.view(task_id)
                if view["state"] in ENDED:
                    assert view["state"] == "FINISHED", view
                    done[task_id] = _epoch(view["finished_at"])
            time.sleep(0.3)
        return done

    def close(self) -> None:
        self.http.close()


def _epoch(stamp: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(stamp).timestamp()


def _seats(stack: Stack) -> redis.Redis:
    return redis.Redis(**stack.redis_login())


def _wait_queued(stack: Stack, tenant: str, at_least: int, timeout_s: float = 60) -> None:
    """Until the tenant has `at_least` tasks queued for a seat."""
    client = _seats(stack)
    key = f"{seats_prefix(stack.config.pool_name)}:waiting"
    deadline = time.monotonic() + timeout_s
    try:
        while int(client.hget(key, tenant) or 0) < at_least:  # type: ignore[arg-type]
            assert time.monotonic() < deadline, f"{tenant} never had {at_least} tasks queued"
            time.sleep(0.1)
    finally:
        client.close()


def test_a_flood_does_not_hold_back_a_quiet_tenant(stack: Stack) -> None:
    flood, quiet = Tenant(stack, "flood"), Tenant(stack, "quiet")
    try:
        flooded = flood.post(24)
        _wait_queued(stack, "flood", 12)
        mine = quiet.post(2)
        # Told honestly: they are next, however many of the flood's wait.
        positions = []
        for task_id in mine:
            view = quiet.view(task_id)
            deadline = time.monotonic() + 10
            while view["queue_position"] is None and view["state"] not in ENDED:
                assert time.monotonic() < deadline, view
                time.sleep(0.1)
                view = quiet.view(task_id)
            positions.append(view["queue_position"])
        # The two POSTs are milliseconds apart, and their first orders reach the queue through
        # two controllers: either may be queued first (first come, first served is by arrival).
        first, second = sorted(positions)
        assert first in (1, 2) and second in (2, 3), positions
        ended = quiet.finished_at(mine)
        flood_ended = flood.finished_at(flooded)
        # Both quiet tasks were done while most of the flood still waited.
        later = [t for t in flood_ended.values() if t > max(ended.values())]
        assert len(later) >= 12, (sorted(flood_ended.values()), ended)
    finally:
        flood.close()
        quiet.close()


def test_seats_follow_the_weights_while_both_tenants_queue(stack: Stack) -> None:
    heavy, light = Tenant(stack, "heavy", seat_weight=3), Tenant(stack, "light")
    samples: Counter[tuple[int, int]] = Counter()
    stop = threading.Event()
    prefix = seats_prefix(stack.config.pool_name)

    def sample() -> None:
        client = _seats(stack)
        turned = False
        try:
            while not stop.is_set():
                waiting = client.hgetall(f"{prefix}:waiting")
                held = client.hgetall(f"{prefix}:held")
                pair = (int(held.get(b"heavy", 0)), int(held.get(b"light", 0)))  # type: ignore[union-attr]
                # Counted once `heavy` holds its share: `light` took every seat before `heavy`
                # asked (no seat idles while anyone waits), and seats change hands only as its
                # tasks end (no preemption), as slowly as they run on a busy machine (CI saw
                # 8 of 35 samples in that handover). What is measured is the share kept after.
                turned = turned or pair[0] >= 3
                if turned and int(waiting.get(b"heavy", 0)) and int(waiting.get(b"light", 0)):  # type: ignore[union-attr]
                    samples[pair] += 1
                stop.wait(0.2)
        finally:
            client.close()

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        light_ids = light.post(16)
        heavy_ids = heavy.post(16)
        sampler.start()
        light.finished_at(light_ids)
        heavy.finished_at(heavy_ids)
    finally:
        stop.set()
        sampler.join(10)
        heavy.close()
        light.close()
    assert sum(samples.values()) >= 10, samples  # the share was reached while both queued
    # Seats change hands one at a time: most samples show 3:1, the rest one seat short.
    full = [s for s in samples.elements() if sum(s) == SEATS]
    at_share = sum(1 for s in full if s == (3, 1))
    assert at_share >= 0.8 * len(full), samples


def test_interactive_tasks_go_ahead_of_their_tenants_batch_work(stack: Stack) -> None:
    team = Tenant(stack, "team")
    try:
        batch = team.post(16, priority="batch")
        _wait_queued(stack, "team", 8)
        urgent = team.post(2)
        assert team.view(urgent[0])["priority"] == "interactive"
        assert team.view(batch[0])["priority"] == "batch"
        place = team.view(urgent[1])
        assert place["queue_position"] in (None, 1, 2), place  # None: seated already
        urgent_ended = team.finished_at(urgent)
        batch_ended = team.finished_at(batch)
        later = [t for t in batch_ended.values() if t > max(urgent_ended.values())]
        assert len(later) >= 6, (sorted(batch_ended.values()), urgent_ended)
        # Seats freed often enough by now for an estimate of a wait.
        more = team.post(12, priority="batch")
        _wait_queued(stack, "team", 6)
        estimates = [team.view(t)["queue_estimate_s"] for t in more[-3:]]
        assert any(e is not None and e > 0 for e in estimates), estimates
        team.finished_at(more)
    finally:
        team.close()


def test_each_tenants_seats_and_waits_are_in_the_metrics(stack: Stack) -> None:
    port = stack.config.metrics_ports["runtime"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert 'deckhands_runtime_tenant_seats{state="queued",tenant="flood"}' in text
    assert 'deckhands_runtime_seat_wait_seconds_count{tenant="flood"}' in text
    # Many of the flood's tasks waited for their seat; the histogram says so.
    waits = [
        line
        for line in text.splitlines()
        if line.startswith('deckhands_runtime_seat_wait_seconds_bucket{le="1.0",tenant="flood"}')
    ]
    total = [
        line
        for line in text.splitlines()
        if line.startswith('deckhands_runtime_seat_wait_seconds_count{tenant="flood"}')
    ]
    assert waits and total
    assert float(waits[0].split()[-1]) < float(total[0].split()[-1])


def test_a_queued_task_asks_the_llm_once_it_is_seated(stack: Stack) -> None:
    """A task queued for a seat makes no LLM call (its log gets no action from the agent)
    until it is seated; then it runs like any other (services/reasoner/seat_wait.py)."""
    flood = Tenant(stack, "backlog")
    client = _seats(stack)
    queue = f"{seats_prefix(stack.config.pool_name)}:queue"
    try:
        posted = flood.post(12)
        _wait_queued(stack, "backlog", 6)
        time.sleep(1.5)  # far past the scripted LLM's 0.2 s: an unheld first step has answered
        still_queued = []
        for task_id in posted:
            if client.zscore(queue, task_id) is None:
                continue
            events = log_of(flood.http, task_id)
            if client.zscore(queue, task_id) is None:
                continue  # seated meanwhile: its first step may have asked
            still_queued.append(task_id)
            acted = [e for e in events if e.get("source") == "AGENT" and e.get("kind") == "run"]
            assert not acted, (task_id, acted)
        assert still_queued, "every task was seated already: nothing to see"
        flood.finished_at(posted)
    finally:
        flood.close()
        client.close()
    held = 0.0
    for name in ("reasoner", "reasoner-2"):
        port = stack.config.metrics_ports[name]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        held += sum(
            float(line.rpartition(" ")[2])
            for line in text.splitlines()
            if line.startswith('deckhands_reasoner_first_steps_held_total{outcome="seated"}')
        )
    assert held >= len(still_queued), held


def test_both_controllers_and_both_reasoners_did_their_share(stack: Stack) -> None:
    """The stack runs as deployed: two controllers sharing the inputs, two reasoners sharing
    the step requests."""
    for name, counter in (
        ("controller", "deckhands_controller_turn_seconds_count"),
        ("controller-2", "deckhands_controller_turn_seconds_count"),
        ("reasoner", "deckhands_reasoner_answers_total{"),
        ("reasoner-2", "deckhands_reasoner_answers_total{"),
    ):
        assert name in stack.running()
        port = stack.config.metrics_ports[name]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        done = sum(
            float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(counter)
        )
        assert done > 0, f"{name} did nothing"


def test_the_fair_order_survives_a_redis_loss_while_tasks_queue(stack: Stack) -> None:
    """Redis loses everything (FLUSHALL) while two tenants' tasks queue for seats: the
    controller rebuilds their States from the log and sends their orders again, the runtime
    queues them again, by tenant, and the quiet tenant is still served before the flood."""
    flood, quiet = Tenant(stack, "flood-2"), Tenant(stack, "quiet-2")
    admin = _seats(stack)
    try:
        flooded = flood.post(20)
        _wait_queued(stack, "flood-2", 10)
        mine = quiet.post(3)
        # Once the controller took each (its log begins): a State lost before that has nothing
        # to be rebuilt from (a gap noted for the issue that makes the controller its creator).
        for task_id in mine:
            deadline = time.monotonic() + 30
            while quiet.view(task_id)["state"] == "LOADING":
                assert time.monotonic() < deadline
                time.sleep(0.05)
        admin.flushall()
        quiet_ended = quiet.finished_at(mine, timeout_s=300)
        flood_ended = flood.finished_at(flooded, timeout_s=300)
        later = [t for t in flood_ended.values() if t > max(quiet_ended.values())]
        assert len(later) >= 8, (sorted(flood_ended.values()), quiet_ended)
    finally:
        admin.close()
        flood.close()
        quiet.close()
