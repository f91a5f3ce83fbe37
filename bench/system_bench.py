"""System benchmark: the whole stack driven through the gateway (a benchmark, not a test).

    .venv/bin/python bench/system_bench.py                 # every row (a few minutes)
    .venv/bin/python bench/system_bench.py --rows 40x2     # one row; see --help

Every service runs as its own process (tools.stack, isolated ports and sandbox pool) on real
nats-server, redis-server and Docker; the LLM is the project's scripted server, answering each
call after a fixed delay. Each row prints its figure beside the baseline measured in the same run:

  40x2     40 tasks at once, 2 LLM calls each (a command, then finish), 2 s per call:
           wall time against the ideal = LLM time of one task + the time this machine takes to
           start the sandboxes the row needs (40 at once, the runtime's own code, measured
           before the row; one start alone is printed too). The stack has run a warm-up task
           first, as a deployment that is up has. Wall time ends at the last task's
           `finished_at`, not at the poll that saw it.
  200x5    200 tasks, 5 calls each, default pool settings: all finish; same ratio (200
           sandbox starts, at most max_sandboxes at once).
  500q     500 tasks posted at once: all finish, none lost, pool never above its maximum.
  steps    (run first, before the crowds leave the engine busy removing their containers)
           tasks of 10 commands on an LLM with no delay, after a warm-up task:
           - CPU per agent step of all deckhands services (ms), from /proc, 20 tasks at once;
           then 5 tasks one after another for the latencies:
           - step overhead: an observation to the next action's observation, minus the LLM's
             own latency (p50, p99);
           - task accepted to its first action's observation, minus the LLM latency.

The scheduling rows (fair, weights, priority, accept, cold, llm) are described in
bench/scheduling_rows.py.

Every sandbox and volume it makes is removed at the end (the stack's `down`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.scheduling_rows import ROWS as SCHEDULING_ROWS  # noqa: E402
from tools.stack import SERVICES, Stack, StackConfig, running  # noqa: E402

ENDED = {"FINISHED", "ERROR", "STOPPED", "REJECTED"}
ROWS: list[tuple[str, str, str, str, str]] = []


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def row(name: str, figure: str, baseline: str, target: str, ok: bool | None) -> None:
    verdict = "" if ok is None else ("met" if ok else "NOT MET")
    ROWS.append((name, figure, baseline, target, verdict))
    print(f"  {name:<44} {figure:<22} {baseline:<30} {target:<16} {verdict}", flush=True)


# --------------------------------------------------------------------------- the LLM script


def script(delay_s: float) -> dict[str, Any]:
    """One conversation per task size: 'calls:N' runs N-1 commands then finishes."""

    def turns(calls: int) -> list[dict[str, Any]]:
        steps: list[dict[str, Any]] = [
            {"tool": "execute_bash", "arguments": {"command": f"echo step {i}"}, "delay_s": delay_s}
            for i in range(1, calls)
        ]
        steps.append(
            {
                "tool": "finish",
                "arguments": {"message": "done: {{last_tool_output}}"},
                "delay_s": delay_s,
            }
        )
        return steps

    return {
        "model": "scripted",
        "conversations": [{"match": f"calls:{n} ", "turns": turns(n)} for n in (2, 5, 10)],
        "turns": turns(2),
    }


# --------------------------------------------------------------------------- driving tasks


async def post_task(client: httpx.AsyncClient, text: str, label: str) -> str:
    body = {"task": text, "max_iterations": 30, "labels": [label]}
    for attempt in range(20):
        try:
            r = await client.post("/v1/tasks", json=body)
        except httpx.TransportError:
            await asyncio.sleep(0.2 * (attempt + 1))
            continue
        if r.status_code in (200, 201, 202):
            return str(r.json()["id"])
        if r.status_code >= 500:
            await asyncio.sleep(0.2 * (attempt + 1))
            continue
        raise RuntimeError(f"POST /v1/tasks answered {r.status_code}: {r.text[:300]}")
    raise RuntimeError("POST /v1/tasks kept failing")


async def listed(client: httpx.AsyncClient, label: str) -> dict[str, dict[str, Any]]:
    """Every task carrying `label`, by id, as `GET /v1/tasks` lists them."""
    found: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"label": label, "limit": 100}
        if cursor:
            params["cursor"] = cursor
        r = await client.get("/v1/tasks", params=params)
        r.raise_for_status()
        page = r.json()
        found.update({t["id"]: t for t in page["tasks"]})
        cursor = page["next_cursor"]
        if not cursor:
            return found


async def wait_all_ended(
    client: httpx.AsyncClient, ids: list[str], label: str, deadline: float, every_s: float
) -> list[dict[str, Any]]:
    """Poll the listing of the run's label (a few requests per poll, however many tasks), as
    a client watching its tasks would, rather than each task: the benchmark's own requests
    would otherwise be a large part of the gateway's CPU."""
    views: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline:
        try:
            views = await listed(client, label)
        except httpx.HTTPError:
            views = views or {}
        if all(views.get(t, {}).get("state") in ENDED for t in ids):
            break
        await asyncio.sleep(every_s)
    return [views.get(t, {}) or {"state": "TIMEOUT"} for t in ids]


def gateway_client(stack: Stack, **options: Any) -> httpx.AsyncClient:
    """A client of the stack's gateway, authenticated as the stack's tenant."""
    return httpx.AsyncClient(
        base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30, **options
    )


async def run_tasks(
    stack: Stack, count: int, calls: int, timeout_s: float, tag: str
) -> tuple[float, list[dict[str, Any]]]:
    """Post `count` tasks at once and wait for all; returns wall time and final views."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    label = f"bench-{uuid.uuid4().hex[:12]}"
    async with gateway_client(stack, limits=limits) as client:
        started = time.monotonic()
        ids = await asyncio.gather(
            *(post_task(client, f"calls:{calls} {tag} #{i}", label) for i in range(count))
        )
        views = await wait_all_ended(client, ids, label, started + timeout_s, 0.5)
        wall = time.monotonic() - started
    for task_id, view in zip(ids, views, strict=True):
        view["task_id"] = task_id
    return wall, views


async def events_of(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    """A finished task's whole log. Storage writes the log a moment after the State says the
    task ended, so this reads until the log holds the end (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        events = await _stored_events(client, task_id)
        ended = any(
            e.get("kind") == "agent_state_changed" and e.get("agent_state") in ENDED for e in events
        )
        if ended or time.monotonic() > deadline:
            return events
        await asyncio.sleep(0.05)


async def _stored_events(client: httpx.AsyncClient, task_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(f"/v1/tasks/{task_id}/events", params={"after": after})
        r.raise_for_status()
        page = r.json()
        events += page["events"]
        if not page["has_more"]:
            return events
        after = page["next_after"]


# --------------------------------------------------------------------------- measurements


def sandbox_start_s() -> float:
    """One hardened sandbox started by the runtime's own code, until its executor answers."""
    from services.runtime.containers import DockerSandboxes
    from services.runtime.settings import RuntimeSettings

    async def once() -> float:
        docker = DockerSandboxes(RuntimeSettings(pool_name="bench-system-start"), "bench")
        try:
            await docker.check()
            times = []
            for _ in range(3):
                started = time.perf_counter()
                sandbox = await docker.create()
                times.append(time.perf_counter() - started)
                await sandbox.session.close()
                await docker.remove(sandbox.container_id)
            return statistics.median(times)
        finally:
            docker.close()

    return asyncio.run(once())


def crowd_start_s(count: int, at_once: int) -> float:
    """Seconds to start `count` hardened sandboxes, `at_once` at a time, with the runtime's own
    code (until every executor answers): what the machine needs to give a crowd of tasks their
    sandboxes. Removed afterwards a few at a time (a burst of removals once wedged the engine)."""
    from services.runtime.containers import DockerSandboxes
    from services.runtime.settings import RuntimeSettings

    async def run() -> float:
        docker = DockerSandboxes(RuntimeSettings(pool_name="bench-system-crowd"), "bench")
        made: list[Any] = []
        try:
            await docker.check()
            started = time.perf_counter()
            for first in range(0, count, at_once):
                made += await asyncio.gather(
                    *(docker.create() for _ in range(min(at_once, count - first)))
                )
            spent = time.perf_counter() - started
        finally:
            removals = asyncio.Semaphore(8)

            async def remove(sandbox: Any) -> None:
                async with removals:
                    await sandbox.session.close()
                    await docker.remove(sandbox.container_id)

            await asyncio.gather(*(remove(s) for s in made), return_exceptions=True)
            docker.close()
        return spent

    return asyncio.run(run())


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[name] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return out


def ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"])).timestamp()


def step_latencies(events: list[dict[str, Any]]) -> tuple[list[float], float | None]:
    """(observation -> next observation minus LLM latency, accepted -> first observation minus
    LLM latency) from one task's log."""
    observations = [e for e in events if e.get("kind") == "run_output"]
    actions = {e["id"]: e for e in events if e.get("kind") == "run"}

    def llm_s(observation: dict[str, Any]) -> float:
        action = actions.get(str(observation.get("cause")))
        usage = (action or {}).get("llm_usage") or {}
        return float(usage.get("latency_ms") or 0.0) / 1000

    gaps = [ts(b) - ts(a) - llm_s(b) for a, b in itertools.pairwise(observations)]
    first = None
    accepted = next((e for e in events if e.get("source") == "USER"), None)
    if accepted is not None and observations:
        first = ts(observations[0]) - ts(accepted) - llm_s(observations[0])
    return gaps, first


# --------------------------------------------------------------------------- rows


def crowd_row(
    stack: Stack,
    name: str,
    count: int,
    calls: int,
    delay_s: float,
    start_s: float,
    limit: float,
    timeout_s: float,
) -> None:
    posted = time.time()
    polled, views = asyncio.run(run_tasks(stack, count, calls, timeout_s, name))
    finished = sum(1 for v in views if v.get("state") == "FINISHED")
    ends = [
        datetime.fromisoformat(str(v["finished_at"])).timestamp()
        for v in views
        if v.get("finished_at")
    ]
    # The last task's own end, not the poll that noticed it (up to `every_s` later).
    wall = max(ends) - posted if len(ends) == count else polled
    ideal = calls * delay_s + start_s
    ratio = wall / ideal
    states: dict[str, int] = {}
    for v in views:
        states[str(v.get("state"))] = states.get(str(v.get("state")), 0) + 1
    print(f"  ({name}: {finished}/{count} finished; states {states})", flush=True)
    row(
        f"{count} tasks x {calls} LLM calls, {delay_s:g} s per call",
        f"wall {wall:.1f} s = {ratio:.2f}x",
        f"ideal {ideal:.1f} s ({calls}x{delay_s:g} s + starts {start_s:.1f} s)",
        f"<= {limit:g}x, all finish",
        ratio <= limit and finished == count,
    )


class PoolWatch:
    """Samples, in a thread, the pool's running task sandboxes, all its containers and the seats
    taken, keeping the highest of each."""

    def __init__(self, stack: Stack) -> None:
        import threading

        import docker
        import redis

        from shared.seat_scripts import seats_prefix

        self.pool = stack.config.pool_name
        self.seats_key = f"{seats_prefix(self.pool)}:seats"
        self.docker = docker.from_env(timeout=60)
        self.redis = redis.Redis(**stack.redis_login())
        self.most = {"task sandboxes": 0, "containers": 0, "seats": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                found = self.docker.api.containers(
                    filters={"label": f"deckhands.pool={self.pool}", "status": "running"}
                )
                tasks = sum(
                    1 for c in found if any(n.startswith("/deckhands-task-") for n in c["Names"])
                )
                seats = int(self.redis.hlen(self.seats_key))  # type: ignore[arg-type]
            except Exception:  # a slow engine: the next sample
                continue
            for name, value in (
                ("task sandboxes", tasks),
                ("containers", len(found)),
                ("seats", seats),
            ):
                self.most[name] = max(self.most[name], value)
            self._stop.wait(0.5)

    def __enter__(self) -> PoolWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)
        self.docker.close()
        self.redis.close()


def queued_row(stack: Stack, count: int, calls: int, max_sandboxes: int, timeout_s: float) -> None:
    with PoolWatch(stack) as watch:
        wall, views = asyncio.run(run_tasks(stack, count, calls, timeout_s, "queued"))
    finished = sum(1 for v in views if v.get("state") == "FINISHED")
    most = watch.most
    print(
        f"  (500q: {finished}/{count} finished in {wall:.1f} s; at most {most['seats']} seats, "
        f"{most['task sandboxes']} running task sandboxes, {most['containers']} containers "
        f"with the warm ones)",
        flush=True,
    )
    row(
        f"{count} tasks queued at once ({calls} LLM calls each)",
        f"{finished}/{count} finished, {wall:.0f} s",
        f"seats <= {max_sandboxes}: most {most['task sandboxes']} running",
        "all, <= max",
        finished == count
        and most["task sandboxes"] <= max_sandboxes
        and most["seats"] <= max_sandboxes,
    )


def steps_row(stack: Stack, tasks: int, steps: int, one_by_one: int) -> None:
    """CPU per step with `tasks` running at once; latencies with `one_by_one` tasks run one after
    another (a latency is what one task sees, not a queue behind other tasks)."""
    # Warm-up, not measured: the first LLM call imports litellm's providers, the pool fills.
    asyncio.run(run_tasks(stack, 2, 2, 120, "warm-up"))
    pids = {n: p for n, p in stack.running().items() if n in SERVICES}
    before = cpu_seconds(pids)
    wall, views = asyncio.run(run_tasks(stack, tasks, steps, 300, "steps"))
    after = cpu_seconds(pids)
    spent = {n: after[n] - before.get(n, 0.0) for n in after}
    finished = [v for v in views if v.get("state") == "FINISHED"]
    agent_steps = sum(int(v["iterations"]) for v in finished)
    per_step_ms = 1000 * sum(spent.values()) / max(1, agent_steps)
    by_service = ", ".join(f"{n} {1000 * s / max(1, agent_steps):.1f}" for n, s in spent.items())
    print(
        f"  ({len(finished)}/{tasks} finished at once, {agent_steps} steps in {wall:.1f} s; "
        f"ms of CPU per step by service: {by_service})",
        flush=True,
    )
    row(
        "orchestration CPU per agent step",
        f"{per_step_ms:.1f} ms",
        "(all six services)",
        "<= 15 ms",
        per_step_ms <= 15,
    )

    alone: list[dict[str, Any]] = []
    for i in range(one_by_one):
        _, done = asyncio.run(run_tasks(stack, 1, steps, 120, f"alone {i}"))
        alone += [v for v in done if v.get("state") == "FINISHED"]

    async def logs() -> list[list[dict[str, Any]]]:
        async with gateway_client(stack) as client:
            return await asyncio.gather(*(events_of(client, v["task_id"]) for v in alone))

    gaps: list[float] = []
    firsts: list[float] = []
    for events in asyncio.run(logs()):
        g, f = step_latencies(events)
        gaps += g
        if f is not None:
            firsts.append(f)
    print(f"  ({len(alone)}/{one_by_one} tasks of {steps} steps run one after another)", flush=True)
    p50, p99 = pct(gaps, 50) * 1000, pct(gaps, 99) * 1000
    row(
        "step overhead (obs -> next obs, LLM excluded)",
        f"p50 {p50:.1f} ms",
        f"p99 {p99:.1f} ms (n={len(gaps)})",
        "p50 <= 20 ms",
        p50 <= 20,
    )
    f50, f99 = pct(firsts, 50) * 1000, pct(firsts, 99) * 1000
    row(
        "task accepted -> first observation",
        f"p50 {f50:.1f} ms",
        f"p99 {f99:.1f} ms (n={len(firsts)})",
        "p50 <= 50 ms",
        f50 <= 50,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--rows",
        default="40x2,200x5,500q,steps," + ",".join(SCHEDULING_ROWS),
        help="comma-separated: 40x2, 200x5, 500q, steps, " + ", ".join(SCHEDULING_ROWS),
    )
    parser.add_argument("--delay", type=float, default=2.0, help="seconds per LLM call")
    args = parser.parse_args(argv)
    rows = set(args.rows.split(","))

    run_dir = Path(tempfile.mkdtemp(prefix="deckhands-sysbench-"))
    script_path = run_dir / "script.json"
    delayed = script(args.delay)
    script_path.write_text(json.dumps(delayed))
    instant_path = run_dir / "instant.json"
    instant_path.write_text(json.dumps(script(0.0)))

    print(f"\n{'row':<46} {'figure':<22} {'baseline (same run)':<30} {'target':<16}")
    if "steps" in rows:
        # First, on a quiet machine: after a crowd row the engine goes on removing hundreds of
        # containers for a while, and the CPU each step costs on 2 shared cores is then not
        # deckhands' alone (the same commit measured 14 ms per step first, 19 ms after 500q).
        config = StackConfig.isolated(run_dir / "instant", llm_script=instant_path)
        with running(config) as stack:
            steps_row(stack, tasks=20, steps=10, one_by_one=5)

    from services.runtime.settings import RuntimeSettings

    seats = RuntimeSettings().max_sandboxes
    starts: dict[int, float] = {}
    start_s = 0.0
    if rows & {"40x2", "200x5"}:
        print("sandbox start (runtime code, create -> executor ready) ...", flush=True)
        start_s = sandbox_start_s()
        print(f"  sandbox start: {start_s * 1000:.0f} ms (median of 3)", flush=True)
    for count in (40, 200):
        if f"{count}x2" in rows or f"{count}x5" in rows:
            starts[count] = crowd_start_s(count, min(count, seats))
            print(
                f"  {count} sandboxes, {min(count, seats)} at once: {starts[count]:.1f} s",
                flush=True,
            )

    if rows & {"40x2", "200x5", "500q"}:
        # Every task is the one tenant's: its quotas must not be what is measured.
        config = StackConfig.isolated(
            run_dir / "delayed",
            llm_script=script_path,
            extra_env={
                "DECKHANDS_TENANT_MAX_RUNNING_TASKS": "10000",
                "DECKHANDS_TENANT_MAX_SANDBOXES": "10000",
            },
        )
        with running(config) as stack:
            # Not measured: the first call of each service's clients, as in a deployment
            # that has been up.
            asyncio.run(run_tasks(stack, 2, 2, 120, "warm-up"))
            if "40x2" in rows:
                crowd_row(stack, "40x2", 40, 2, args.delay, starts[40], 1.5, 300)
            if "200x5" in rows:
                crowd_row(stack, "200x5", 200, 5, args.delay, starts[200], 2.0, 900)
            if "500q" in rows:
                queued_row(stack, 500, 2, seats, 1200)

    for name, scheduling_row in SCHEDULING_ROWS.items():
        if name in rows:
            scheduling_row(run_dir, args.delay, row)

    print("\nsummary")
    for name, figure, baseline, target, verdict in ROWS:
        print(f"  {name:<44} {figure:<22} {baseline:<30} {target:<16} {verdict}")


if __name__ == "__main__":
    main()
