"""An in-process container engine: what the runtime asks of Docker (services/runtime/
containers.py, DockerSandboxes), held in memory, with FakeSandbox sessions for executors.

The runtime's real parts (the warm pool, the task sandboxes, seating, upkeep, reconciliation)
run on it unchanged: `RuntimeService(..., engine=FAKE_ENGINE)` or `build_runtime(...,
engine=FAKE_ENGINE)`. A container is a record (its name, labels, state) whose workspace files
every session attached to it shares, so they outlive a stop or a pause as a volume's do. Every
engine call is recorded in `calls`, in order, so a test can say what was started, stopped,
paused and removed; `kill` and `place` stand for what happens to containers behind the
runtime's back (a crash, a leftover of another replica).

What it does not do (the Docker tests in tests/integration/runtime/ hold those): hardening,
networks, quotas, keepers, archives, helper containers.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import docker

from services.runtime.containers import (
    IDLE_PREFIX,
    LABEL_REPLICA,
    NO_NETWORK,
    ContainerInfo,
    DockerSandboxes,
    Sandbox,
)
from services.runtime.egress_folders import EgressFolders
from services.runtime.errors import SandboxStartError
from services.runtime.sandbox_shape import POOL_SHAPE, SandboxShape
from services.runtime.service import Engine
from services.runtime.settings import RuntimeSettings
from shared.sandbox_protocol.messages import BashRequest
from tests.fakes.sandbox import FakeSandbox, ran

__all__ = ["FAKE_ENGINE", "FakeContainer", "FakeEngine", "engine_of"]

T = TypeVar("T")


@dataclass
class FakeContainer:
    id: str
    name: str
    labels: dict[str, str]
    status: str = "running"  # running, paused or exited
    exit_code: int | None = None
    oom_killed: bool = False
    created: float = field(default_factory=time.time)
    files: dict[str, str] = field(default_factory=dict)  # its /workspace
    sessions: list[FakeSandbox] = field(default_factory=list)

    def info(self) -> ContainerInfo:
        return ContainerInfo(
            id=self.id,
            name=self.name,
            running=self.status == "running",
            status=self.status,
            labels=dict(self.labels),
            oom_killed=self.oom_killed,
            exit_code=self.exit_code,
            created=self.created,
        )

    def end_sessions(self, reason: str) -> None:
        for session in self.sessions:
            session.lose(reason)


class FakeEngine:
    """DockerSandboxes' interface in memory (see the module docstring)."""

    def __init__(
        self,
        settings: RuntimeSettings,
        replica_id: str,
        commands: Callable[[BashRequest], tuple[str, int]] = ran,
        shared_with: FakeEngine | None = None,
    ) -> None:
        self.settings = settings
        self.replica_id = replica_id
        self.commands = commands  # how every session answers a command
        self.delay_s = 0.0  # how long each session's calls take
        self.fail_starts = 0  # the next creations that fail, as an engine refusing them would
        self.pending_names: set[str] = set()
        self.egress_folders = EgressFolders(None)  # no egress proxy in these tests
        # The engine's containers and every session ever attached: one engine's, shared by
        # the processes that use it (`another_process`).
        self.containers: dict[str, FakeContainer] = {}
        self.sessions: list[FakeSandbox] = []
        if shared_with is not None:
            self.containers, self.sessions = shared_with.containers, shared_with.sessions
        self.calls: list[tuple[str, str]] = []  # (operation, container id), in order

    def another_process(self) -> Engine:
        """The `engine` of another runtime process on this same engine (a restart, or a
        second process of the replica)."""

        def make(settings: RuntimeSettings, replica_id: str) -> DockerSandboxes:
            return cast(DockerSandboxes, FakeEngine(settings, replica_id, self.commands, self))

        return make

    # -- what tests ask

    def ops(self, operation: str) -> list[str]:
        """The containers `operation` (create, remove, stop, pause, ...) was called for."""
        return [cid for op, cid in self.calls if op == operation]

    def commands_run(self) -> list[str]:
        """Every command any sandbox was asked to run, in order."""
        return [r["command"] for s in self.sessions for r in s.ops("bash")]

    def named(self, name: str) -> FakeContainer | None:
        return next((c for c in self.containers.values() if c.name == name), None)

    def kill(self, container_id: str, *, oom: bool = False) -> None:
        """The container dies (its executor with it), as a crash or the OOM killer would."""
        container = self.containers[container_id]
        container.status, container.exit_code, container.oom_killed = "exited", 137, oom
        container.end_sessions("the container exited")

    def place(
        self, replica_id: str, *, name: str | None = None, status: str = "running"
    ) -> FakeContainer:
        """A container of this pool that another process made (or left behind)."""
        container = FakeContainer(
            id=secrets.token_hex(32),
            name=name or IDLE_PREFIX + secrets.token_hex(6),
            labels={**self.labels(self.pool_network), LABEL_REPLICA: replica_id},
            status=status,
        )
        self.containers[container.id] = container
        return container

    # -- DockerSandboxes' interface

    async def check(self) -> None:
        return None

    @property
    def pool_network(self) -> str:
        s = self.settings
        return s.sandbox_network_name if s.sandbox_network else NO_NETWORK

    def labels(self, network: str) -> dict[str, str]:
        # The real engine's labels: the pool's and reconciliation's filters see the same.
        return DockerSandboxes.labels(cast(Any, self), network)

    async def create(self, shape: SandboxShape = POOL_SHAPE) -> Sandbox:
        name = IDLE_PREFIX + secrets.token_hex(6)
        network = shape.network or self.pool_network
        self.pending_names.add(name)
        try:
            await asyncio.sleep(0)  # others run meanwhile, as during a real start
            if self.fail_starts > 0:
                self.fail_starts -= 1
                raise SandboxStartError("cannot create a sandbox: the engine refused it")
            container = FakeContainer(secrets.token_hex(32), name, self.labels(network))
            self.containers[container.id] = container
            self.calls.append(("create", container.id))
            sandbox = await self.attach(container.id, name)
        finally:
            self.pending_names.discard(name)
        sandbox.network = network
        sandbox.workspace_bytes = shape.workspace_bytes
        sandbox.egress = shape.egress
        return sandbox

    async def attach(self, container_id: str, name: str, timeout_s: float = 5.0) -> Sandbox:
        container = self.containers.get(container_id)
        if container is None or container.status != "running":
            raise SandboxStartError(f"cannot attach to {container_id[:12]}: not running")
        session = FakeSandbox(name, commands=self.commands, delay_s=self.delay_s)
        session.files = container.files  # the workspace outlives the session
        container.sessions.append(session)
        self.sessions.append(session)
        self.calls.append(("attach", container_id))
        return Sandbox(container_id=container_id, name=name, session=session)

    def _get(self, container_id: str) -> FakeContainer:
        container = self.containers.get(container_id)
        if container is None:
            raise docker.errors.NotFound(f"No such container: {container_id}")
        return container

    async def rename(self, container_id: str, name: str) -> None:
        holder = self.named(name)
        if holder is not None and holder.id != container_id:
            await self.remove(holder.id)
        self._get(container_id).name = name
        self.calls.append(("rename", container_id))

    async def stop(self, container_id: str, timeout_s: int = 5) -> None:
        container = self._get(container_id)
        container.status, container.exit_code = "exited", 143
        container.end_sessions("the container was stopped")
        self.calls.append(("stop", container_id))

    async def start(self, container_id: str) -> None:
        container = self._get(container_id)
        container.status, container.exit_code = "running", None
        self.calls.append(("start", container_id))

    async def pause(self, container_id: str) -> None:
        self._get(container_id).status = "paused"
        self.calls.append(("pause", container_id))

    async def unpause(self, container_id: str) -> None:
        self._get(container_id).status = "running"
        self.calls.append(("unpause", container_id))

    async def remove(self, container_id: str) -> None:
        container = self.containers.pop(container_id, None)
        if container is not None:
            container.end_sessions("the container was removed")
            self.calls.append(("remove", container_id))

    async def keep_workspace(self, container_id: str) -> None:
        self.calls.append(("keep_workspace", container_id))

    async def release_workspace(self, container_id: str) -> None:
        self.calls.append(("release_workspace", container_id))

    async def remove_stray_keepers(self) -> int:
        return 0

    async def prune_volumes(self) -> int:
        return 0

    async def drain(self, timeout_s: float) -> None:
        return None

    async def list(self, *, everything: bool = True) -> list[ContainerInfo]:
        return [c.info() for c in self.containers.values() if everything or c.status == "running"]

    async def inspect(self, ref: str) -> ContainerInfo | None:
        container = self.containers.get(ref) or self.named(ref)
        return container.info() if container is not None else None

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def api(self) -> Any:
        return _LowLevel(self)

    async def stats_memory(self, container_id: str) -> int:
        return 0

    def close(self) -> None:
        return None


class _LowLevel:
    """The engine's low-level listing (docker-py's `api`), for the runtime's sweeps of helper
    containers: this engine starts none."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine

    def containers(self, **query: Any) -> list[dict[str, Any]]:
        wanted = (query.get("filters") or {}).get("label") or []
        return [
            {"Id": c.id, "Names": [f"/{c.name}"], "Labels": c.labels, "Created": c.created}
            for c in self.engine.containers.values()
            if all(label in {f"{k}={v}" for k, v in c.labels.items()} for label in wanted)
        ]

    def remove_container(self, container_id: str, **_: Any) -> None:
        self.engine.containers.pop(container_id, None)


# What RuntimeService and build_runtime take as their `engine`.
FAKE_ENGINE = cast(Engine, FakeEngine)


def engine_of(sandboxes: object) -> FakeEngine:
    """The fake behind a service's `docker` (made with `engine=FAKE_ENGINE`)."""
    assert isinstance(sandboxes, FakeEngine), sandboxes
    return sandboxes
