"""Benchmark of workspace checkpoints (issue 28) on this machine (a benchmark, not a test).

    .venv/bin/python bench/checkpoint_bench.py [--edits 20] [--steps 20] [--think 0.5]

Starts its own nats-server and redis-server and a runtime (RuntimeService, the real Docker
engine and sandbox image), then prints, each beside a baseline from the same run:
  - a one-file edit in a workspace of 2,000 files / 50 MB (a repository checkout's size):
    the checkpoint's time (p50, p99) and its stored bytes against the changed bytes;
  - a `pip install`-sized change (5,000 new files, 80 MB): time and stored bytes;
  - the step overhead, one observation to the next with the LLM's time (--think, slept)
    taken out, checkpoints on against off; and with no LLM time at all, where the next action
    waits for the whole checkpoint (the worst case);
  - a restore after the sandbox is removed (50 MB): the next action's observation after its
    order, against the same action in a warm sandbox.
Every container it makes carries a bench pool label and is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import docker  # noqa: E402

from services.runtime.checkpoint_store import CheckpointStore  # noqa: E402
from services.runtime.containers import LABEL_POOL  # noqa: E402
from services.runtime.service import RuntimeService  # noqa: E402
from services.runtime.settings import RuntimeSettings  # noqa: E402
from shared.commands import ExecuteAction  # noqa: E402
from shared.events import (  # noqa: E402
    CmdOutputObservation,
    CmdRunAction,
    EventBase,
    EventSource,
    WorkspaceCheckpointObservation,
)
from shared.settings import CommonSettings  # noqa: E402
from shared.streams import ensure_streams  # noqa: E402
from tools.procs import free_port, start_nats, start_redis  # noqa: E402

# 2,000 files of 25 KB in 40 folders: 50 MB, as a checkout of a real repository.
CHECKOUT = (
    'python3 -c "import os, base64\n'
    "for d in range(40):\n"
    "    os.makedirs(f'repo/pkg{d + 1}', exist_ok=True)\n"
    "    for f in range(50):\n"
    "        data = base64.encodebytes(os.urandom(18750))\n"
    "        open(f'repo/pkg{d + 1}/mod{f + 1}.py', 'wb').write(data)\n\""
)
# 5,000 new files of 16 KB: 80 MB, what `pip install` of a large package leaves.
INSTALL = (
    'python3 -c "import os, base64\n'
    "for d in range(100):\n"
    "    os.makedirs(f'venv/site/pkg{d + 1}', exist_ok=True)\n"
    "    for f in range(50):\n"
    "        data = base64.encodebytes(os.urandom(12000))\n"
    "        open(f'venv/site/pkg{d + 1}/m{f + 1}.py', 'wb').write(data)\n\""
)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


class Bench:
    def __init__(self, service: RuntimeService) -> None:
        self.service = service
        self.events: list[EventBase] = []
        self.seq = 0
        service.publish = self.publish

    async def publish(self, event: EventBase) -> None:
        self.events.append(event)

    async def run(self, task_id: str, command: str, **order: Any) -> tuple[float, Any]:
        """One action: its time from order to observation, and its observation."""
        self.seq += 2
        action = CmdRunAction(
            task_id=task_id, source=EventSource.AGENT, command=command, seq=self.seq
        )
        started = time.perf_counter()
        observation = await self.service.execution.run(
            ExecuteAction(task_id=task_id, action=action, **order), last_try=True
        )
        took = time.perf_counter() - started
        assert isinstance(observation, CmdOutputObservation), observation
        assert observation.exit_code == 0, observation.content
        return took, observation

    async def checkpoint(self, task_id: str) -> WorkspaceCheckpointObservation:
        assert self.service.checkpoints is not None
        await self.service.checkpoints.settle(task_id)
        made = [e for e in self.events if isinstance(e, WorkspaceCheckpointObservation)]
        assert made and made[-1].task_id == task_id and not made[-1].skipped, made[-1:]
        return made[-1]


async def _ignore(event: EventBase) -> None:
    return None


async def main(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="deckhands-ckpt-bench-"))
    nats_port, redis_port = free_port(), free_port()
    procs = [
        start_nats(nats_port, root / "nats", root / "nats.log"),
        start_redis(redis_port, root / "redis", root / "redis.log"),
    ]
    common = CommonSettings(
        nats_url=f"nats://127.0.0.1:{nats_port}", redis_url=f"redis://127.0.0.1:{redis_port}/0"
    )
    await ensure_streams(common)
    import nats

    nc = await nats.connect(common.nats_url)
    js = nc.jetstream()
    pool = f"bench-ckpt-{uuid.uuid4().hex[:6]}"
    services = []
    try:
        on = RuntimeService(
            RuntimeSettings(
                **{
                    **common.model_dump(include=set(CommonSettings.model_fields)),
                    "pool_name": pool,
                    "pool_min_idle": 1,
                    "sandbox_workspace_size": "512m",
                    "sandbox_inodes": 65536,
                }
            ),
            _ignore,
            checkpoint_store=CheckpointStore(lambda: js),
        )
        off = RuntimeService(
            on.settings.model_copy(update={"checkpoints": False, "pool_name": pool + "-off"}),
            _ignore,
        )
        services = [on, off]
        await on.start()
        bench = Bench(on)
        print("== a one-file edit in a workspace of 2,000 files / 50 MB")
        task = uuid.uuid4().hex
        took, _ = await bench.run(task, CHECKOUT)
        first = await bench.checkpoint(task)
        print(
            f"  the checkout itself: {took:.1f} s; its checkpoint {first.took_ms:.0f} ms, "
            f"{first.files} paths, {first.bytes / 1e6:.1f} MB, "
            f"stored {first.stored_bytes / 1e6:.1f} MB"
        )
        times, ratios = [], []
        for i in range(args.edits):
            edit = f"sed -i '1s/^/# edit {i}\\n/' repo/pkg{1 + i % 40}/mod{1 + i % 50}.py"
            await bench.run(task, edit)
            made = await bench.checkpoint(task)
            changed = 25_400 + 10 * (i + 1)  # the edited file's bytes, about
            times.append(made.took_ms)
            ratios.append(made.stored_bytes / changed)
        print(
            f"  checkpoint after the edit: p50 {pct(times, 50):.1f} ms, "
            f"p99 {pct(times, 99):.1f} ms "
            f"(target p50 <= 30 ms); stored bytes / changed bytes: p50 {pct(ratios, 50):.2f}, "
            f"max {max(ratios):.2f} (target <= 2)"
        )

        print("== a pip-install-sized change: 5,000 new files, 80 MB")
        took, _ = await bench.run(task, INSTALL)
        made = await bench.checkpoint(task)
        print(
            f"  the command: {took:.1f} s; its checkpoint {made.took_ms / 1000:.2f} s, "
            f"{made.changed} paths changed, stored {made.stored_bytes / 1e6:.1f} MB "
            f"(workspace {made.bytes / 1e6:.0f} MB)"
        )

        print(
            f"== step overhead, observation to next observation with the LLM's {args.think:g} s "
            f"taken out ({args.steps} steps)"
        )
        step = "echo step >> notes.txt && sed -i '1s/^/#/' repo/pkg2/mod2.py"

        async def steps(runner: Bench, task_id: str, think: float) -> list[float]:
            overheads = []
            for _ in range(args.steps):
                started = time.perf_counter()
                await runner.run(task_id, step)
                await asyncio.sleep(think)  # the LLM choosing the next action
                overheads.append(time.perf_counter() - started - think)
            return overheads

        await off.start()
        plain = Bench(off)
        other = uuid.uuid4().hex
        await plain.run(other, CHECKOUT)
        for think in (args.think, 0.0):
            with_ckpt = await steps(bench, task, think)
            assert on.checkpoints is not None
            await on.checkpoints.settle(task)
            without = await steps(plain, other, think)
            on_p50, off_p50 = statistics.median(with_ckpt), statistics.median(without)
            target = " (target <= 1.25x)" if think else " (no LLM time to hide it in)"
            print(
                f"  LLM {think:g} s: checkpoints on p50 {on_p50 * 1000:.1f} ms, off "
                f"{off_p50 * 1000:.1f} ms: {on_p50 / off_p50:.2f}x{target}"
            )

        print("== restore after the sandbox is lost (workspace of 50 MB)")
        restore_task = uuid.uuid4().hex
        await bench.run(restore_task, CHECKOUT)
        made = await bench.checkpoint(restore_task)
        warm, _ = await bench.run(restore_task, "cat repo/pkg1/mod1.py > /dev/null")
        sandbox = on.tasks.local(restore_task)
        assert sandbox is not None
        client = docker.from_env(timeout=60)
        client.api.remove_container(sandbox.container_id, force=True)
        assert on.checkpoints is not None
        await on.checkpoints.settle(restore_task)
        took, observation = await bench.run(
            restore_task, "cat repo/pkg1/mod1.py > /dev/null", checkpoint_seq=made.action_seq
        )
        assert "restored" in observation.content, observation.content
        print(
            f"  the next action's observation {took:.2f} s after its order (target <= 3 s); "
            f"in the warm sandbox {warm * 1000:.0f} ms"
        )
    finally:
        for service in services:
            await service.stop()
        client = docker.from_env(timeout=60)
        for name in (pool, pool + "-off"):
            labels = {"label": f"{LABEL_POOL}={name}"}
            for container in client.containers.list(all=True, filters=labels):
                container.remove(force=True)
        await nc.close()
        for proc in procs:
            proc.terminate()


if __name__ == "__main__":
    # The restore's own account (where its time went) beside the figures.
    logging.basicConfig(level=logging.WARNING, format="  %(name)s: %(message)s")
    logging.getLogger("deckhands.runtime.checkpoints").setLevel(logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--think", type=float, default=0.5, help="seconds the LLM takes per step (slept)"
    )
    asyncio.run(main(parser.parse_args()))
