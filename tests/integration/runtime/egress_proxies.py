"""Egress proxy replicas (services/egress in .venv-egress) as processes of a test, each with its
health port; killed with their process group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from tools.procs import free_port
from tools.stack import egress_python

__all__ = ["Proxies"]


class Proxies:
    def __init__(
        self, folder: Path, logs: Path, nats_url: str, env: dict[str, str] | None = None
    ) -> None:
        self.folder, self.logs, self.nats_url = folder, logs, nats_url
        self.env = env or {}
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str) -> None:
        python = egress_python()
        assert python is not None, "no .venv-egress: run `make deps`"
        port = free_port()
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

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for name in list(self.procs):
            self.kill(name)
