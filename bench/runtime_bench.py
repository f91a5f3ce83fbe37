"""Benchmark of the runtime-executor on this machine (a benchmark, not a test).

    .venv/bin/python bench/runtime_bench.py            # full run (~5 minutes on 2 cores)
    .venv/bin/python bench/runtime_bench.py --quick    # fewer samples, smaller crowd

Prints p50 and p99 of:
  - cold start: a hardened sandbox from container create until its executor answers,
    against plain `docker run` of the same image (`-d ... sleep`, which returns once started,
    and `--rm ... true`, which runs to completion);
  - warm acquire from the pool (a ready, health-checked sandbox);
  - `echo hi` through the attached executor, against `docker exec <container> echo hi`;
  - `echo hi` as a whole action over NATS (ExecuteAction in, observation out) against a bare
    JetStream publish-to-fetch hop, when nats-server and redis-server are available;
then the same with 50 tasks at once, then how many sandboxes stay alive together and their
memory. Every container it creates carries a bench pool label and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from services.runtime.containers import LABEL_POOL, DockerSandboxes, Sandbox  # noqa: E402
from services.runtime.pool import WarmPool  # noqa: E402
from services.runtime.settings import RuntimeSettings  # noqa: E402
from shared.sandbox_protocol.messages import BashRequest  # noqa: E402
from shared.sandbox_protocol.session import answers  # noqa: E402

ECHO: BashRequest = {"command": "echo hi", "timeout_s": 10}

IMAGE = os.environ.get("DECKHANDS_SANDBOX_IMAGE", "deckhands/sandbox:latest")
POOL = f"bench-{uuid.uuid4().hex[:6]}"


# --------------------------------------------------------------------------- reporting

ROWS: list[tuple[str, str, str, str]] = []


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def report(name: str, seconds: list[float], note: str = "") -> float:
    p50, p99 = pct(seconds, 50) * 1000, pct(seconds, 99) * 1000
    ROWS.append((name, f"{p50:9.2f}", f"{p99:9.2f}", f"n={len(seconds)} {note}".strip()))
    print(
        f"  {name:<58} p50 {p50:9.2f} ms   p99 {p99:9.2f} ms   (n={len(seconds)}) {note}",
        flush=True,
    )
    return p50


def section(title: str) -> None:
    print(f"\n== {title}", flush=True)


# --------------------------------------------------------------------------- helpers


async def docker_cli_async(*args: str) -> float:
    """The docker CLI as a child process of its own: many can run at the same moment."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "docker", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    if await proc.wait() != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed")
    return time.perf_counter() - started


def docker_cli(*args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["docker", *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - started


async def timed(coro: Awaitable[Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = await coro
    return time.perf_counter() - started, result


def cleanup(client: docker.DockerClient) -> None:
    for c in client.api.containers(all=True, filters={"label": f"{LABEL_POOL}={POOL}"}):
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(c["Id"], force=True, v=True)
    for c in client.api.containers(all=True, filters={"label": "deckhands.bench=baseline"}):
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(c["Id"], force=True, v=True)


def baseline_run_detached(name: str) -> float:
    return docker_cli(
        "run",
        "-d",
        "--name",
        name,
        "--label",
        "deckhands.bench=baseline",
        "--entrypoint",
        "sleep",
        IMAGE,
        "600",
    )


def baseline_run_to_end() -> float:
    return docker_cli(
        "run", "--rm", "--label", "deckhands.bench=baseline", "--entrypoint", "true", IMAGE
    )


def remove_by_name(*names: str) -> None:
    subprocess.run(
        ["docker", "rm", "-f", *names],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


async def wait_idle(pool: WarmPool, count: int) -> None:
    while pool.idle < count:  # noqa: ASYNC110 - polling the pool's state is the point
        await asyncio.sleep(0.05)


def mem_available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def cgroup_memory_mb(container_id: str) -> float | None:
    for path in (
        f"/sys/fs/cgroup/memory/docker/{container_id}/memory.usage_in_bytes",
        f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.current",
    ):
        with contextlib.suppress(OSError, ValueError):
            return int(Path(path).read_text()) / 2**20
    return None


# --------------------------------------------------------------------------- single task


async def single(args: argparse.Namespace, settings: RuntimeSettings) -> dict[str, float]:
    figures: dict[str, float] = {}
    docker_sbx = DockerSandboxes(settings, "bench")
    section("one at a time")

    # Warm-up (image layers in the page cache), not measured.
    sandbox = await docker_sbx.create()
    await docker_sbx.remove(sandbox.container_id)
    await asyncio.to_thread(baseline_run_to_end)

    cold: list[float] = []
    for _ in range(args.samples):
        elapsed, sandbox = await timed(docker_sbx.create())
        cold.append(elapsed)
        await sandbox.session.close()
        await docker_sbx.remove(sandbox.container_id)
    figures["cold"] = report("cold start (create -> executor ready)", cold)

    detached: list[float] = []
    for i in range(args.samples):
        name = f"bench-baseline-{uuid.uuid4().hex[:6]}-{i}"
        detached.append(await asyncio.to_thread(baseline_run_detached, name))
        await asyncio.to_thread(remove_by_name, name)
    figures["docker_run_d"] = report("baseline: docker run -d (returns once started)", detached)
    to_end = [await asyncio.to_thread(baseline_run_to_end) for _ in range(args.samples)]
    figures["docker_run_rm"] = report(
        "baseline: docker run --rm ... true (runs to the end)", to_end
    )

    pool_settings = settings.model_copy(
        update={
            "pool_min_idle": 3,
            "pool_max_idle": 3,
            "pool_health_interval_s": 30.0,
        }
    )
    pool = WarmPool(pool_settings, docker_sbx)
    pool.start()
    warm: list[float] = []
    try:
        for _ in range(args.samples):
            await wait_idle(pool, 1)
            elapsed, sandbox = await timed(pool.acquire())
            warm.append(elapsed)
            await pool.discard(sandbox.container_id, "bench")
    finally:
        await pool.stop()
    figures["warm"] = report("warm acquire (idle sandbox, pinged before handing out)", warm)

    sandbox = await docker_sbx.create()
    try:
        for _ in range(20):
            await sandbox.session.bash(ECHO, 15)
        echo: list[float] = []
        for _ in range(args.samples * 10):
            elapsed, answer = await timed(sandbox.session.bash(ECHO, 15))
            assert answer["output"] == "hi\n"
            echo.append(elapsed)
        figures["echo"] = report("echo hi through the executor (attach stream)", echo)
        exec_cli = [
            await asyncio.to_thread(docker_cli, "exec", sandbox.container_id, "echo", "hi")
            for _ in range(args.samples)
        ]
        figures["docker_exec"] = report("baseline: docker exec <container> echo hi", exec_cli)
        api = docker.from_env().api
        exec_api: list[float] = []
        for _ in range(args.samples):
            started = time.perf_counter()
            exec_id = api.exec_create(sandbox.container_id, ["echo", "hi"])["Id"]
            api.exec_start(exec_id)
            exec_api.append(time.perf_counter() - started)
        report("baseline: docker exec via the API (exec_create + exec_start)", exec_api)
    finally:
        await sandbox.session.close()
        await docker_sbx.remove(sandbox.container_id)
    return figures


# --------------------------------------------------------------------------- 50 at once


async def crowd(args: argparse.Namespace, settings: RuntimeSettings) -> None:
    n = args.concurrency
    docker_sbx = DockerSandboxes(settings, "bench")
    section(f"{n} tasks at once")

    results = await asyncio.gather(*(timed(docker_sbx.create()) for _ in range(n)))
    report(f"cold start, {n} concurrent", [t for t, _ in results])
    await asyncio.gather(*(s.session.close() for _, s in results))
    await asyncio.gather(*(docker_sbx.remove(s.container_id) for _, s in results))

    names = [f"bench-crowd-{uuid.uuid4().hex[:6]}-{i}" for i in range(n)]
    detached = await asyncio.gather(
        *(
            docker_cli_async(
                "run",
                "-d",
                "--name",
                name,
                "--label",
                "deckhands.bench=baseline",
                "--entrypoint",
                "sleep",
                IMAGE,
                "600",
            )
            for name in names
        )
    )
    report(f"baseline: docker run -d, {n} concurrent", list(detached))
    await asyncio.to_thread(remove_by_name, *names)

    pool_settings = settings.model_copy(
        update={
            "pool_min_idle": n,
            "pool_max_idle": n,
            "pool_max_total": 2 * n + 10,
            "pool_create_concurrency": 8,
            "pool_health_interval_s": 60.0,
        }
    )
    pool = WarmPool(pool_settings, docker_sbx)
    pool.start()
    try:
        await wait_idle(pool, n)
        acquired = await asyncio.gather(*(timed(pool.acquire()) for _ in range(n)))
        report(f"warm acquire, {n} concurrent (pool pre-filled with {n})", [t for t, _ in acquired])
        sandboxes: list[Sandbox] = [s for _, s in acquired]
        assert len({s.container_id for s in sandboxes}) == n

        async def echo_loop(sandbox: Sandbox) -> list[float]:
            times = []
            for _ in range(args.rounds):
                elapsed, _ = await timed(sandbox.session.bash(ECHO, 35))
                times.append(elapsed)
            return times

        loops = await asyncio.gather(*(echo_loop(s) for s in sandboxes))
        report(
            f"echo hi through the executor, {n} tasks at once",
            [t for times in loops for t in times],
        )

        async def exec_loop(cid: str) -> list[float]:
            return [await docker_cli_async("exec", cid, "echo", "hi") for _ in range(2)]

        execs = await asyncio.gather(*(exec_loop(s.container_id) for s in sandboxes))
        report(f"baseline: docker exec echo hi, {n} at once", [t for ts in execs for t in ts])
        await asyncio.gather(*(pool.discard(s.container_id, "bench") for s in sandboxes))
    finally:
        await pool.stop()


# --------------------------------------------------------------------------- capacity


async def capacity(args: argparse.Namespace, settings: RuntimeSettings) -> None:
    section(f"how many sandboxes stay alive at once (up to {args.capacity})")
    docker_sbx = DockerSandboxes(settings, "bench")
    before = mem_available_mb()
    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    alive: list[Sandbox] = []
    started = time.perf_counter()
    batch = 10
    stop_reason = f"reached {args.capacity}"
    while len(alive) < args.capacity:
        if mem_available_mb() < 0.15 * total_mb:
            stop_reason = "stopped: under 15% of memory left"
            break
        wanted = min(batch, args.capacity - len(alive))
        made = await asyncio.gather(
            *(docker_sbx.create() for _ in range(wanted)), return_exceptions=True
        )
        errors = [m for m in made if isinstance(m, BaseException)]
        alive.extend(m for m in made if isinstance(m, Sandbox))
        if errors:
            stop_reason = f"stopped: {errors[0]}"
            break
    elapsed = time.perf_counter() - started
    await asyncio.sleep(2)
    answering = sum(await asyncio.gather(*(answers(s.session, 10) for s in alive)))
    echo = await asyncio.gather(*(s.session.bash(ECHO, 35) for s in alive))
    assert all(a["output"] == "hi\n" for a in echo)
    after = mem_available_mb()
    per = [m for m in (cgroup_memory_mb(s.container_id) for s in alive) if m is not None]
    print(
        f"  alive and answering: {answering}/{len(alive)} ({stop_reason}); "
        f"started in {elapsed:.1f}s",
        flush=True,
    )
    print(
        f"  host memory used by them: {before - after:.0f} MiB "
        f"({(before - after) / max(1, len(alive)):.1f} MiB each; machine total "
        f"{total_mb:.0f} MiB)",
        flush=True,
    )
    if per:
        print(
            f"  cgroup memory per sandbox: p50 {statistics.median(per):.1f} MiB, "
            f"max {max(per):.1f} MiB, sum {sum(per):.0f} MiB",
            flush=True,
        )
    ROWS.append(
        (
            "sandboxes alive at once",
            str(answering),
            "",
            f"{(before - after) / max(1, len(alive)):.1f} MiB each",
        )
    )
    await asyncio.gather(*(s.session.close() for s in alive))
    await asyncio.gather(*(docker_sbx.remove(s.container_id) for s in alive))


# --------------------------------------------------------------------------- over NATS


async def over_nats(args: argparse.Namespace, settings: RuntimeSettings) -> None:
    try:
        import nats
        from redis.asyncio import Redis

        from services.runtime.main import build_runtime
        from shared.commands import ExecuteAction
        from shared.events import AgentState, CmdRunAction, EventSource
        from shared.settings import CommonSettings
        from shared.state import Approval, ApprovedBy, Awaiting, TaskState
        from shared.state_store import TaskStateStore
        from shared.streams import ensure_streams
        from shared.subjects import WORK_STREAM, Service, work_subject
        from tools.procs import free_port, start_nats, start_redis
    except ImportError as exc:
        print(f"\n(skipping the NATS figures: {exc})")
        return
    section("a whole action over NATS JetStream (ExecuteAction -> observation)")
    root = Path(tempfile.mkdtemp(prefix="deckhands-bench-"))
    procs = []
    try:
        nats_port, redis_port = free_port(), free_port()
        procs.append(start_nats(nats_port, root / "nats", root / "nats.log"))
        procs.append(start_redis(redis_port, root / "redis", root / "redis.log"))
    except Exception as exc:
        print(f"  (skipped: cannot start nats-server/redis-server: {exc})")
        for p in procs:
            p.terminate()
        return
    common = CommonSettings(
        nats_url=f"nats://127.0.0.1:{nats_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0"
    )
    await ensure_streams(common)
    rt_settings = settings.model_copy(
        update={
            "nats_url": common.nats_url,
            "redis_url": common.redis_url,
            "pool_min_idle": 1,
        }
    )
    app, service = build_runtime(rt_settings)
    await app.start()
    # FastStream logs a line per message (its logger is set up by start), drowning the figures.
    logging.getLogger("faststream.access.nats").setLevel(logging.WARNING)
    nc = await nats.connect(common.nats_url)
    js = nc.jetstream()
    try:
        # Bare JetStream hop: publish to a work subject, fetch it with a pull consumer.
        hop_task = uuid.uuid4().hex
        sub = await js.pull_subscribe(
            work_subject(Service.CONTROLLER, hop_task), durable=None, stream=WORK_STREAM
        )
        hops = []
        for i in range(args.samples * 5):
            started = time.perf_counter()
            await js.publish(
                work_subject(Service.CONTROLLER, hop_task),
                b"{}",
                headers={"Nats-Msg-Id": f"{hop_task}-{i}"},
            )
            msg = (await sub.fetch(1, timeout=5))[0]
            await msg.ack()
            hops.append(time.perf_counter() - started)
        report("baseline: one JetStream hop (publish -> fetch -> ack)", hops)

        states = TaskStateStore(Redis.from_url(common.redis_url))

        async def action(task: str, sub: Any, command: str) -> tuple[float, dict[str, Any]]:
            act = CmdRunAction(task_id=task, source=EventSource.AGENT, command=command)
            order = ExecuteAction(task_id=task, action=act)
            # As the controller does before it sends the order: the State awaits the action,
            # approved (the runtime runs nothing else). Not timed: the controller's part.
            state = await states.load(task)
            assert state is not None
            approval = Approval(action_id=act.id, by=ApprovedBy.SECURITY, answer_id=act.id)
            await states.save(
                state.model_copy(
                    update={
                        "awaiting": Awaiting.RUNTIME,
                        "awaiting_id": act.id,
                        "pending_action": act,
                        "approval": approval,
                    }
                )
            )
            started = time.perf_counter()
            await js.publish(
                work_subject(Service.RUNTIME, task),
                order.model_dump_json().encode(),
                headers={"Nats-Msg-Id": order.id},
            )
            msg = (await sub.fetch(1, timeout=30))[0]
            elapsed = time.perf_counter() - started
            await msg.ack()
            return elapsed, json.loads(msg.data)

        async def new_task() -> tuple[str, Any]:
            task = uuid.uuid4().hex
            await states.create(
                TaskState(
                    task_id=task, task="bench", max_iterations=1000, agent_state=AgentState.RUNNING
                )
            )
            sub = await js.pull_subscribe(
                work_subject(Service.CONTROLLER, task), durable=None, stream=WORK_STREAM
            )
            return task, sub

        await action(*(await new_task()), "echo warm")  # the process's first: connections etc.
        firsts = []
        for _ in range(args.samples):
            await wait_idle(service.pool, 1)
            await asyncio.sleep(1.0)  # a pool that has been warm for a moment, as in service
            task, sub = await new_task()
            elapsed, _ = await action(task, sub, "echo first")
            firsts.append(elapsed)
        report("a new task's first action (warm acquire + bind + run)", firsts)
        task, sub = await new_task()
        await action(task, sub, "echo warm")
        times = []
        for _ in range(args.samples * 5):
            elapsed, obs = await action(task, sub, "echo hi")
            assert obs["content"] == "hi\n", obs
            times.append(elapsed)
        report("echo hi as a whole action (2 JetStream hops + executor)", times)
    finally:
        await nc.close()
        await app.stop()
        for p in procs:
            p.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)


# --------------------------------------------------------------------------- main


async def main(args: argparse.Namespace) -> None:
    client = docker.from_env()
    client.images.get(IMAGE)  # build it with deploy/sandbox/build.sh
    settings = RuntimeSettings(sandbox_image=IMAGE, pool_name=POOL, pool_min_idle=0)
    print(
        f"deckhands runtime benchmark: image {IMAGE}, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}, hardening as configured by default "
        f"(memory {settings.sandbox_memory}, cpus {settings.sandbox_cpus}, "
        f"pids {settings.sandbox_pids}, workspace {settings.sandbox_workspace})"
    )
    try:
        figures = await single(args, settings)
        if not args.no_crowd:
            await crowd(args, settings)
        if not args.no_nats:
            await over_nats(args, settings)
        if args.capacity:
            await capacity(args, settings)
    finally:
        cleanup(client)
    section("targets")
    checks: list[tuple[str, bool, str]] = [
        ("warm acquire p50 <= 20 ms", figures["warm"] <= 20, f"{figures['warm']:.2f} ms"),
        ("echo hi p50 <= 5 ms", figures["echo"] <= 5, f"{figures['echo']:.2f} ms"),
        (
            "echo hi >= 10x faster than docker exec",
            figures["docker_exec"] >= 10 * figures["echo"],
            f"{figures['docker_exec'] / figures['echo']:.0f}x",
        ),
        (
            "cold start <= 1.1x docker run -d",
            figures["cold"] <= 1.1 * figures["docker_run_d"],
            f"{figures['cold'] / figures['docker_run_d']:.2f}x",
        ),
        (
            "cold start <= 1.1x docker run --rm true",
            figures["cold"] <= 1.1 * figures["docker_run_rm"],
            f"{figures['cold'] / figures['docker_run_rm']:.2f}x",
        ),
    ]
    for name, ok, value in checks:
        print(f"  [{'met' if ok else 'MISSED'}] {name}: {value}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20, help="samples per single figure")
    parser.add_argument("--concurrency", type=int, default=50, help="tasks at once")
    parser.add_argument(
        "--rounds", type=int, default=20, help="echo round trips per task under concurrency"
    )
    parser.add_argument(
        "--capacity", type=int, default=100, help="sandboxes to keep alive at once (0 skips)"
    )
    parser.add_argument("--no-crowd", action="store_true", help="skip the concurrent figures")
    parser.add_argument("--no-nats", action="store_true", help="skip the NATS figures")
    parser.add_argument("--quick", action="store_true", help="small numbers, for a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.concurrency, args.rounds, args.capacity = 5, 10, 5, 10
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
