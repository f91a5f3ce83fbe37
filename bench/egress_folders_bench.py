"""What keeping the egress folders on the engine's host costs (a benchmark, not a test).

    .venv/bin/python bench/egress_folders_bench.py [--sandboxes 30]

A runtime on the gVisor node pool shares no folder with its engine (DECKHANDS_EGRESS_ENGINE_DIR,
services/runtime/egress_stores.py): each sandbox's folder is made, each policy written and
each folder removed by a helper container, which takes each change over its attached stdin.
An action writes its
policy twice (its scope before it, the task's `between_actions` after it). This prints, for a
folder shared with the engine (DECKHANDS_EGRESS_DIR, the baseline) and through the engine, the
p50 and p99 of a make, of one policy written, and of a removal, over --sandboxes folders, one
after another, then with all of them at once. The helper's start (once per runtime) is shown
apart. Every container it makes carries a bench pool label and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from services.runtime.egress_folders import EgressFolders  # noqa: E402
from services.runtime.egress_stores import EngineFolders, LocalFolders  # noqa: E402
from services.runtime.sandbox_labels import LABEL_POOL  # noqa: E402
from shared.egress_policy import EgressPolicy, SandboxEgress  # noqa: E402

IMAGE = "deckhands/sandbox:latest"
POOL = "bench-egress-folders"
WIDE = SandboxEgress(task_id="t", network=EgressPolicy(allow=("pypi.org", "github.com")))
NARROW = SandboxEgress(task_id="t", network=EgressPolicy(allow=()))


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"p50 {1000 * statistics.median(ordered):6.1f} ms  p99 {1000 * p99:6.1f} ms"


async def _timed(step: Awaitable[Any]) -> float:
    started = time.perf_counter()
    await step
    return time.perf_counter() - started


async def _rounds(folders: EgressFolders, count: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"make": [], "policy": [], "remove": []}
    tokens = []
    for _ in range(count):
        started = time.perf_counter()
        token, _path = await folders.make(WIDE)
        times["make"].append(time.perf_counter() - started)
        tokens.append(token)
    for token in tokens:
        for policy in (NARROW, WIDE):
            times["policy"].append(await _timed(folders.refresh(token, policy)))
    for token in tokens:
        times["remove"].append(await _timed(folders.remove(token)))
    return times


async def _at_once(folders: EgressFolders, count: int) -> float:
    started = time.perf_counter()
    made = await asyncio.gather(*(folders.make(WIDE) for _ in range(count)))
    await asyncio.gather(*(folders.refresh(token, NARROW) for token, _ in made))
    await asyncio.gather(*(folders.remove(token) for token, _ in made))
    return time.perf_counter() - started


async def main(count: int) -> None:
    client = docker.from_env(timeout=60)
    threads = ThreadPoolExecutor(max_workers=16)

    async def call(fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(threads, fn, *args)

    with tempfile.TemporaryDirectory(prefix="egress-folders-") as root:
        local = EgressFolders(LocalFolders(str(Path(root) / "shared")))
        engine_store = EngineFolders(
            call, lambda: client.api, str(Path(root) / "engine"), IMAGE, 0, POOL, "bench"
        )
        engine = EgressFolders(engine_store)
        try:
            first = await _timed(engine.sweep(set()))  # the helper made and started
            rows = {"shared folder": local, "through the engine": engine}
            print(f"egress folders, {count} sandboxes; the helper's start: {1000 * first:.0f} ms")
            for name, folders in rows.items():
                times = await _rounds(folders, count)
                for step, samples in times.items():
                    print(f"  {name:19} {step:7} {_ms(samples)}")
            for name, folders in rows.items():
                took = await _at_once(folders, count)
                print(f"  {name:19} {count} made, written, removed at once: {took:.2f} s")
        finally:
            for raw in client.api.containers(all=True, filters={"label": f"{LABEL_POOL}={POOL}"}):
                client.api.remove_container(raw["Id"], force=True)
            threads.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=30)
    asyncio.run(main(parser.parse_args().sandboxes))
