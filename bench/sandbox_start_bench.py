"""How fast this engine starts sandboxes, with networking disabled and without (a benchmark).

    .venv/bin/python bench/sandbox_start_bench.py [--sandboxes 30] [--rounds 2]

A sandbox without a network is created with networking disabled (services/runtime/isolation.py,
OFFLINE): the engine then skips its libnetwork prestart hook, which re-executes dockerd's own
binary at every container start. This starts --sandboxes sandboxes through the runtime's own
path (create, start, attach, the executor's first answer), `sandbox_start_concurrency` at once
as the runtime does, first as the runtime now creates them, then as it did before (network
"none" alone, the baseline), --rounds times each in turn, and prints for each: the wall time,
sandboxes a second, a start's p50 and p99, and the machine's CPU time per start (all of
/proc/stat's busy time, the engine's processes included). Every sandbox it makes carries a bench
pool label and is removed after each round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.runtime import sandbox_host_config  # noqa: E402
from services.runtime.containers import DockerSandboxes  # noqa: E402
from services.runtime.settings import RuntimeSettings  # noqa: E402

POOL = "bench-sandbox-starts"
OFFLINE = dict(sandbox_host_config.OFFLINE)


def _busy_s() -> float:
    """Seconds of CPU the whole machine has spent busy (user, system, interrupts, ...)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / 100


async def _round(docker: DockerSandboxes, count: int, concurrency: int) -> dict[str, float]:
    gate = asyncio.Semaphore(concurrency)
    durations: list[float] = []
    made: list[str] = []

    async def start_one() -> None:
        async with gate:
            began = time.perf_counter()
            sandbox = await docker.create()
            durations.append(time.perf_counter() - began)
            made.append(sandbox.container_id)
            await sandbox.session.close()

    busy, began = _busy_s(), time.perf_counter()
    try:
        await asyncio.wait_for(asyncio.gather(*(start_one() for _ in range(count))), 300)
        wall, cpu = time.perf_counter() - began, _busy_s() - busy
    finally:
        await asyncio.gather(*(docker.remove(cid) for cid in made))
    ordered = sorted(durations)
    return {
        "wall": wall,
        "rate": count / wall,
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "cpu": cpu / count,
    }


async def main(count: int, rounds: int) -> None:
    settings = RuntimeSettings(pool_name=POOL)
    docker = DockerSandboxes(settings, "bench")
    await docker.check()
    concurrency = settings.sandbox_start_concurrency
    print(f"{count} sandboxes, {concurrency} at once, {rounds} rounds of each, in turn")
    results: dict[str, list[dict[str, float]]] = {"networking disabled": [], "baseline": []}
    try:
        for _ in range(rounds):
            for label in results:
                # The baseline: network "none" alone, as sandboxes were created before.
                sandbox_host_config.OFFLINE = OFFLINE if label != "baseline" else {}
                results[label].append(await _round(docker, count, concurrency))
    finally:
        sandbox_host_config.OFFLINE = OFFLINE
        docker.close()
    for label, runs in results.items():
        for r in runs:
            print(
                f"  {label:20s} wall {r['wall']:5.2f} s  {r['rate']:4.1f}/s  "
                f"start p50 {1000 * r['p50']:4.0f} ms p99 {1000 * r['p99']:5.0f} ms  "
                f"CPU {1000 * r['cpu']:4.0f} ms a start"
            )
    best = {label: min(r["wall"] for r in runs) for label, runs in results.items()}
    print(f"best wall: {best['networking disabled'] / best['baseline']:.2f}x the baseline's")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sandboxes", type=int, default=30, help="sandboxes a round (<= 100)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each (<= 5)")
    args = parser.parse_args()
    if not (1 <= args.sandboxes <= 100 and 1 <= args.rounds <= 5):
        parser.error("--sandboxes must be 1-100 and --rounds 1-5")
    asyncio.run(main(args.sandboxes, args.rounds))
