"""The scheduling rows of the system benchmark (issue 25), each with its baseline from the same
run, on stacks of the deployed shape (two controllers, two reasoners and two gateways, as
deploy/k8s/base runs them);
`bench/system_bench.py --rows fair,weights,priority,accept,cold,llm` runs them.

  fair      tenant `quiet` posts 3 tasks on an idle stack (its baseline), tenant `flood` posts
            300 alone (its baseline); then `flood` posts 300 and `quiet` 3 more two seconds
            later. 3 LLM calls of 2 s a task, default seats (100).
  weights   tenants weighted 3 and 1 post 120 tasks each at once, 40 seats: the seats each
            holds, sampled while both have tasks queued.
  priority  one tenant posts 300 batch tasks, then 3 interactive ones: their time against
            the same 3 on the idle stack.
  accept    right after the stack started: 500 tasks posted by 50 clients at once, one attempt
            each: every answer, the time each POST took.
  cold      40 tasks x 5 LLM calls of 2 s (3 shell steps sleeping 0.3 s each) posted right after
            the stack started (the pool at its minimum), against one such task on a warm stack.
  llm       the scripted LLM enforcing 20 calls at once and 600 a minute (429 past them),
            deckhands told the same limits (DECKHANDS_LLM_CAPACITY): 200 tasks of 3 calls.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench.http_load import LeanClient
from tools.api_access import auth_headers, issue_key, set_limits
from tools.stack import Stack, StackConfig, running

ENDED = {"FINISHED", "ERROR", "STOPPED", "REJECTED"}
Row = Callable[[str, str, str, str, bool | None], None]


def script(delay_s: float, path: Path, limits: dict[str, Any] | None = None) -> Path:
    """'calls:N' tasks run N-1 commands then finish; 'cold:' tasks run 3 commands sleeping 0.3 s
    then think twice more; each LLM call answers after `delay_s`."""

    def turns(calls: int) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = [
            {"tool": "execute_bash", "arguments": {"command": f"echo step {i}"}, "delay_s": delay_s}
            for i in range(1, calls)
        ]
        return [*steps, {"tool": "finish", "arguments": {"message": "done"}, "delay_s": delay_s}]

    sleepy = [
        {
            "tool": "execute_bash",
            "arguments": {"command": f"sleep 0.3; echo {i}"},
            "delay_s": delay_s,
        }
        for i in range(3)
    ]
    cold = [
        *sleepy,
        {"tool": "think", "arguments": {"thought": "All three ran."}, "delay_s": delay_s},
        {"tool": "finish", "arguments": {"message": "done"}, "delay_s": delay_s},
    ]
    body: dict[str, Any] = {
        "model": "scripted",
        "conversations": [
            {"match": "cold:", "turns": cold},
            *({"match": f"calls:{n} ", "turns": turns(n)} for n in (2, 3, 5)),
        ],
        "turns": turns(3),
    }
    if limits:
        body["limits"] = limits
    path.write_text(json.dumps(body))
    return path


class Tenant:
    """One tenant's async client on the stack (made through the admin API)."""

    def __init__(self, stack: Stack, name: str, **limits: Any) -> None:
        gateway = stack.config.gateway_url
        key = issue_key(gateway, stack.admin_api_key, name, name="bench")
        if limits:
            set_limits(gateway, stack.admin_api_key, name, **limits)
        self.name = name
        self.headers = auth_headers(key)
        self.gateway = gateway

    def client(self, connections: int = 32) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        return httpx.AsyncClient(
            base_url=self.gateway, headers=self.headers, timeout=60, limits=limits
        )


async def post(client: httpx.AsyncClient, text: str, **body: Any) -> tuple[str, float]:
    """Post one task, as a careful client does: with an Idempotency-Key, so that a refusal that
    asks for a retry and a connection lost before the answer (a keep-alive connection the
    server closed as it was reused) are sent again safely; its id and when it was accepted."""
    key = {"Idempotency-Key": uuid.uuid4().hex}
    for _ in range(50):
        try:
            answer = await client.post(
                "/v1/tasks", json={"task": text, "max_iterations": 30, **body}, headers=key
            )
        except httpx.TransportError:
            await asyncio.sleep(0.5)
            continue
        if answer.status_code == 202:
            return str(answer.json()["id"]), time.time()
        if answer.status_code in (429, 503):
            await asyncio.sleep(float(answer.headers.get("Retry-After", "1")))
            continue
        raise RuntimeError(f"POST /v1/tasks answered {answer.status_code}: {answer.text[:300]}")
    raise RuntimeError("POST /v1/tasks kept refusing")


async def ended(
    client: httpx.AsyncClient,
    ids: list[str],
    timeout_s: float,
    every_s: float = 2.0,
    since: float | None = None,
) -> dict[str, dict[str, Any]]:
    """The final views of the tasks, polled by listing (pages of 100, only the tasks created
    after `since`). The figures come from each task's finished_at, so polling every 2 s costs
    them nothing, while listing 600 tasks a second took a sixth of this 2-core machine from
    the system under test."""
    views: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    wanted = set(ids)
    while time.monotonic() < deadline:
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": 100}
            if since is not None:
                params["created_after"] = datetime.fromtimestamp(since - 1, UTC).isoformat()
            if cursor:
                params["cursor"] = cursor
            answer = await client.get("/v1/tasks", params=params)
            answer.raise_for_status()
            page = answer.json()
            for view in page["tasks"]:
                if view["id"] in wanted and view["state"] in ENDED:
                    views[view["id"]] = view
            cursor = page["next_cursor"]
            if not cursor:
                break
        if len(views) == len(wanted):
            return views
        await asyncio.sleep(every_s)
    raise RuntimeError(f"{len(wanted) - len(views)} of {len(wanted)} tasks did not end")


def finished_at(view: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(view["finished_at"])).timestamp()


async def run_batch(
    tenant: Tenant, count: int, text: str, timeout_s: float, **body: Any
) -> tuple[float, list[float], dict[str, dict[str, Any]]]:
    """Post `count` tasks at once; (when posting began, each task's time from its POST to its
    end, the final views)."""
    async with tenant.client() as client:
        began = time.time()
        posted = await asyncio.gather(*(post(client, f"{text} #{i}", **body) for i in range(count)))
        views = await ended(client, [task_id for task_id, _ in posted], timeout_s, since=began)
    times = [finished_at(views[task_id]) - at for task_id, at in posted]
    return began, times, views


def settle(stack: Stack, idle: int = 16, timeout_s: float = 120) -> None:
    """Wait until the last run's sandboxes are gone (at most `idle` of the stack's pool left):
    a run that starts while the engine still removes 300 containers measures the removals."""
    import subprocess

    label = f"label=deckhands.pool={stack.config.pool_name}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["docker", "ps", "-aq", "--filter", label],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if len(listed.stdout.split()) <= idle:
            break
        time.sleep(1)
    time.sleep(3)


def deployed(run_dir: Path, **overrides: Any) -> StackConfig:
    """An isolated stack of the shape deploy/k8s/base and `make up` run: two controllers, two
    reasoners, two gateways."""
    return StackConfig.isolated(run_dir, controllers=2, reasoners=2, gateways=2, **overrides)


def _all_finished(views: dict[str, dict[str, Any]]) -> bool:
    return all(v["state"] == "FINISHED" for v in views.values())


# --------------------------------------------------------------------------- rows


def fair_rows(run_dir: Path, delay_s: float, row: Row) -> None:
    """The fair and priority rows, on one stack with the default seats."""
    config = deployed(
        run_dir / "fair",
        llm_script=script(delay_s, run_dir / "fair.json"),
        extra_env={"DECKHANDS_TENANT_MAX_RUNNING_TASKS": "10000"},
    )
    with running(config) as stack:
        quiet, flood, team = Tenant(stack, "quiet"), Tenant(stack, "flood"), Tenant(stack, "team")
        asyncio.run(run_batch(quiet, 2, "calls:3 warm-up", 120))  # not measured
        _, idle, _ = asyncio.run(run_batch(quiet, 3, "calls:3 idle", 120))
        began, _, alone_views = asyncio.run(run_batch(flood, 300, "calls:3 alone", 900))
        alone_wall = max(finished_at(v) for v in alone_views.values()) - began
        settle(stack)

        async def together() -> tuple[float, list[float], dict[str, dict[str, Any]], bool]:
            flooding = asyncio.create_task(run_batch(flood, 300, "calls:3 flood", 900))
            await asyncio.sleep(2)
            _, times, views = await run_batch(quiet, 3, "calls:3 quiet", 900)
            f_began, _, f_views = await flooding
            wall = max(finished_at(v) for v in f_views.values()) - f_began
            return wall, times, views, _all_finished(f_views) and _all_finished(views)

        flood_wall, quiet_times, _, ok = asyncio.run(together())
        settle(stack)
        base = statistics.mean(idle)
        row(
            "B's 3 tasks while A floods 300 (3 x 2 s calls)",
            f"B {max(quiet_times):.1f} s = {max(quiet_times) / base:.2f}x",
            f"B alone {base:.1f} s",
            "<= 1.5x",
            max(quiet_times) <= 1.5 * base and ok,
        )
        row(
            "A's 300 tasks with B's 3 among them",
            f"A {flood_wall:.1f} s = {flood_wall / alone_wall:.2f}x",
            f"A alone {alone_wall:.1f} s",
            "<= 1.1x",
            flood_wall <= 1.1 * alone_wall and ok,
        )

        async def urgent() -> tuple[list[float], bool]:
            batch = asyncio.create_task(
                run_batch(team, 300, "calls:3 batch", 900, priority="batch")
            )
            await asyncio.sleep(2)
            _, times, views = await run_batch(team, 3, "calls:3 urgent", 900)
            _, _, b_views = await batch
            return times, _all_finished(views) and _all_finished(b_views)

        urgent_times, ok = asyncio.run(urgent())
        row(
            "3 interactive after the tenant's 300 batch",
            f"{max(urgent_times):.1f} s = {max(urgent_times) / base:.2f}x",
            f"on the idle stack {base:.1f} s",
            "<= 1.5x",
            max(urgent_times) <= 1.5 * base and ok,
        )


def weights_row(run_dir: Path, delay_s: float, row: Row) -> None:
    import redis

    from shared.seat_scripts import seats_prefix

    seats = 40
    config = deployed(
        run_dir / "weights",
        llm_script=script(delay_s, run_dir / "weights.json"),
        extra_env={"DECKHANDS_MAX_SANDBOXES": str(seats)},
    )
    with running(config) as stack:
        heavy, light = Tenant(stack, "heavy", seat_weight=3), Tenant(stack, "light")
        prefix = seats_prefix(config.pool_name)
        samples: list[tuple[int, int]] = []
        stop = threading.Event()

        def sample() -> None:
            client = redis.Redis(**stack.redis_login())
            try:
                while not stop.wait(0.5):
                    waiting = client.hgetall(f"{prefix}:waiting")
                    held = client.hgetall(f"{prefix}:held")
                    if int(waiting.get(b"heavy", 0)) and int(waiting.get(b"light", 0)):  # type: ignore[union-attr]
                        samples.append((int(held.get(b"heavy", 0)), int(held.get(b"light", 0))))  # type: ignore[union-attr]
            finally:
                client.close()

        async def both() -> bool:
            results = await asyncio.gather(
                run_batch(light, 120, "calls:3 light", 900),
                run_batch(heavy, 120, "calls:3 heavy", 900),
            )
            return all(_all_finished(views) for _, _, views in results)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            ok = asyncio.run(both())
        finally:
            stop.set()
            sampler.join(10)
        mean_heavy = statistics.mean(h for h, _ in samples) if samples else 0.0
        mean_light = statistics.mean(lt for _, lt in samples) if samples else 0.0
        ratio = mean_heavy / mean_light if mean_light else float("inf")
        row(
            "seats of tenants weighted 3:1, both queued",
            f"{mean_heavy:.1f}:{mean_light:.1f} = {ratio:.2f}",
            f"{seats} seats, {len(samples)} samples",
            "3 +-10 %",
            abs(ratio - 3) <= 0.3 and ok and len(samples) >= 5,
        )


def accept_row(run_dir: Path, delay_s: float, row: Row) -> None:
    config = deployed(
        run_dir / "accept",
        llm_script=script(delay_s, run_dir / "accept.json"),
        extra_env={"DECKHANDS_TENANT_MAX_RUNNING_TASKS": "10000"},
    )
    with running(config) as stack:
        tenant = Tenant(stack, "many")
        took: list[float] = []
        codes: dict[int, int] = {}

        async def client_posts(client: LeanClient, n: int) -> None:
            for i in range(10):
                started = time.perf_counter()
                answer = await client.post(
                    "/v1/tasks", {"task": f"calls:2 accept {n}.{i}", "max_iterations": 30}
                )
                took.append(time.perf_counter() - started)
                codes[answer.status_code] = codes.get(answer.status_code, 0) + 1

        async def burst() -> None:
            # 50 machines' clients, on this one's 2 cores: a lean client (bench/http_load.py)
            clients = [LeanClient(tenant.gateway, tenant.headers) for _ in range(50)]
            try:
                await asyncio.gather(*(client_posts(c, n) for n, c in enumerate(clients)))
            finally:
                await asyncio.gather(*(c.aclose() for c in clients))

        began, cpu_began = time.perf_counter(), time.process_time()
        asyncio.run(burst())
        spent, client_cpu = time.perf_counter() - began, time.process_time() - cpu_began
        p50, p99 = statistics.median(took) * 1000, sorted(took)[int(0.99 * (len(took) - 1))] * 1000
        print(
            f"  (accept: answers {codes}; all 500 answered in {spent:.1f} s; the 50 clients "
            f"used {client_cpu:.1f} CPU-s)",
            flush=True,
        )
        row(
            "500 POSTs by 50 clients right after start",
            f"p99 {p99:.0f} ms",
            f"p50 {p50:.0f} ms, {codes.get(202, 0)} x 202",
            "p99 <= 250 ms, all 202",
            p99 <= 250 and codes.get(202, 0) == 500,
        )


def cold_row(run_dir: Path, delay_s: float, row: Row) -> None:
    path = script(delay_s, run_dir / "cold.json")
    warm = deployed(run_dir / "cold-warm", llm_script=path)
    with running(warm) as stack:
        tenant = Tenant(stack, "cold")
        asyncio.run(run_batch(tenant, 2, "calls:2 warm-up", 120))
        time.sleep(3)  # the pool refilled: the next task's sandbox is warm
        _, one, _ = asyncio.run(run_batch(tenant, 1, "cold: alone", 120))
    fresh = deployed(run_dir / "cold-burst", llm_script=path)
    with running(fresh) as stack:
        tenant = Tenant(stack, "cold")
        began, _, views = asyncio.run(run_batch(tenant, 40, "cold: burst", 300))
        wall = max(finished_at(v) for v in views.values()) - began
    row(
        "40 x 5 calls of 2 s right after start",
        f"wall {wall:.1f} s = {wall / one[0]:.2f}x",
        f"one task, warm sandbox {one[0]:.1f} s",
        "<= 1.5x",
        wall <= 1.5 * one[0] and _all_finished(views),
    )


def llm_row(run_dir: Path, delay_s: float, row: Row) -> None:
    limits = {"max_concurrent": 20, "requests_per_minute": 600}
    capacity = json.dumps({"openai/scripted": limits})
    config = deployed(
        run_dir / "llm",
        llm_script=script(delay_s, run_dir / "llm.json", limits),
        extra_env={
            "DECKHANDS_LLM_CAPACITY": capacity,
            "DECKHANDS_TENANT_MAX_RUNNING_TASKS": "10000",
        },
    )
    with running(config) as stack:
        tenant = Tenant(stack, "llm")
        began, _, views = asyncio.run(run_batch(tenant, 200, "calls:3 limited", 900))
        wall = max(finished_at(v) for v in views.values()) - began
        stats = httpx.get(f"http://127.0.0.1:{config.llm_port}/stats", timeout=10).json()
    errors = sum(1 for v in views.values() if v["state"] == "ERROR")
    within = stats["max_concurrent_seen"] <= 20 and stats["max_requests_in_60s"] <= 600
    shown = {k: v for k, v in stats.items() if k != "tasks"}
    print(f"  (llm: the scripted server saw {shown})", flush=True)
    row(
        "200 tasks on an LLM limited to 20 at once, 600/min",
        f"{len(views) - errors}/200 finished, {wall:.0f} s",
        f"seen: {stats['max_concurrent_seen']} at once, {stats['max_requests_in_60s']}/min, "
        f"{stats['refused_429']} x 429",
        "all, within limits",
        within and errors == 0 and _all_finished(views),
    )


ROWS: dict[str, Callable[[Path, float, Row], None]] = {
    "fair": fair_rows,
    "weights": weights_row,
    "accept": accept_row,
    "cold": cold_row,
    "llm": llm_row,
}
