"""Egress proxy replicas (services/egress in .venv-egress) as processes of a test, each with its
health port, killed with their process group; and running a command in a test task's sandbox."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from runtime_helpers import Controller  # type: ignore[import-not-found]

from shared.events import CmdOutputObservation, CmdRunAction, EventSource
from tools.procs import free_port
from tools.stack import egress_python

__all__ = ["Proxies", "sh", "two_proxies"]


class Proxies:
    def __init__(
        self, folder: Path, logs: Path, nats_url: str, env: dict[str, str] | None = None
    ) -> None:
        self.folder, self.logs, self.nats_url = folder, logs, nats_url
        self.env = env or {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ports: dict[str, int] = {}  # health and metrics

    def start(self, name: str) -> None:
        python = egress_python()
        assert python is not None, "no .venv-egress: run `make deps`"
        port = self.ports[name] = free_port()
        env = {
            **os.environ,
            "DECKHANDS_EGRESS_DIR": str(self.folder),
            "DECKHANDS_EGRESS_REPLICA": name,
            "DECKHANDS_EGRESS_HEALTH_PORT": str(port),
            "DECKHANDS_NATS_URL": self.nats_url,
            "DECKHANDS_EGRESS_ACTIVITY_INTERVAL_S": "0.2",
            **self.env,
        }
        self.procs[name] = subprocess.Popen(
            [str(python), "-m", "services.egress"],
            env=env,
            stdout=(self.logs / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            assert self.procs[name].poll() is None, (self.logs / f"{name}.log").read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"egress proxy {name} not ready"
            time.sleep(0.1)

    def counted(self, metric: str) -> float:
        """A counter's total over the replicas running (no labels)."""
        total = 0.0
        for name in self.procs:
            text = httpx.get(f"http://127.0.0.1:{self.ports[name]}/metrics", timeout=5).text
            total += sum(
                float(line.split()[1])
                for line in text.splitlines()
                if line.startswith(metric + " ")
            )
        return total

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)


@contextmanager
def two_proxies(
    folder: Path, logs: Path, nats_url: str, env: dict[str, str] | None = None
) -> Iterator[Proxies]:
    """egress-0 and egress-1 on `folder`; stopped however the test ends (a start that failed
    included: none is left running)."""
    running = Proxies(folder, logs, nats_url, env)
    try:
        running.start("egress-0")
        running.start("egress-1")
        yield running
    finally:
        running.stop()


async def sh(ctl: Controller, command: str) -> str:
    """The output of a command the task's agent runs in its sandbox."""
    seen = await ctl.run(
        CmdRunAction(task_id=ctl.task_id, source=EventSource.AGENT, command=command)
    )
    assert isinstance(seen, CmdOutputObservation), seen
    return str(seen.content)
