"""Where and how the local stack runs (tools/stack.py): its services, the ports and data
directory, the NATS nodes, the LLM, the replicas of each service. Read from the DECKHANDS_STACK_*
variables, or made `isolated` for a test that shares nothing with `make up`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .procs import free_port

__all__ = ["DEFAULT_SCRIPT", "ROOT", "SERVICES", "WORKERS", "StackConfig"]

SERVICES = ("storage", "controller", "security", "runtime", "reasoner", "gateway")
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
    # Gateway processes sharing its port (SO_REUSEPORT), as deploy/k8s/base runs two replicas:
    # a burst of POSTs is served on both cores (`isolated` stacks run one unless told).
    gateways: int = int(os.environ.get("DECKHANDS_STACK_GATEWAYS", "2"))
    # Egress proxy replicas (services/egress), as deploy/k8s runs two; 0: none (a task with a
    # network policy then reaches nothing, and is told so).
    egress_proxies: int = int(os.environ.get("DECKHANDS_STACK_EGRESS_PROXIES", "2"))
    # Each egress proxy's /healthz, /readyz and /metrics port (the stack waits on them).
    egress_ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = (
            ("CONTROLLERS", self.controllers),
            ("REASONERS", self.reasoners),
            ("GATEWAYS", self.gateways),
        )
        for setting, count in counts:
            if count < 1:
                raise ValueError(f"DECKHANDS_STACK_{setting}={count}: at least 1")
        for name, service in self.replicas:
            if service in self.metrics_ports:
                self.metrics_ports.setdefault(name, free_port())
        for name in self.egress_names:
            self.egress_ports.setdefault(name, free_port())
        if self.nats_nodes < 1:
            raise ValueError(f"DECKHANDS_STACK_NATS_NODES={self.nats_nodes}: at least 1")
        if self.nats_nodes > 1 and not self.nats_cluster_ports:
            self.nats_cluster_ports = tuple(
                (self.nats_port + i, self.nats_port + 2000 + i) for i in range(self.nats_nodes)
            )
        if self.nats_cluster_ports:
            self.nats_port = self.nats_cluster_ports[0][0]

    @property
    def egress_dir(self) -> Path:
        """The runtime's and the egress proxies' shared folder (DECKHANDS_EGRESS_DIR)."""
        return self.run_dir / "egress"

    @property
    def egress_names(self) -> tuple[str, ...]:
        return tuple(f"egress-{i}" for i in range(self.egress_proxies))

    @property
    def replicas(self) -> tuple[tuple[str, str], ...]:
        """(name, service) of each process beyond a service's first: `controller-2`..."""
        counts = (
            ("controller", self.controllers),
            ("reasoner", self.reasoners),
            ("gateway", self.gateways),
        )
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
            "gateways": 1,
        }
        return cls(**(fields | overrides))

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway_port}"

    def health_url(self, service: str) -> str:
        """Where a worker answers /healthz and /readyz (KeyError: no port for it)."""
        return f"http://127.0.0.1:{self.metrics_ports[service]}"
