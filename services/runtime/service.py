"""The runtime's parts, made once and started once.

One RuntimeService per process. Building it does no I/O: it makes the parts (Docker, the warm
pool, Redis' records, the seats, the jobs of execution.py, seating.py, upkeep.py,
workspace_ops.py) and hands each its collaborators. `start` does the I/O (Docker, Redis,
reconciliation, the warm pool, the background loops); `stop` ends it, leaving task sandboxes for
adoption. The handlers (handlers.py) call the parts for each message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable

from shared.admission import SandboxSeats
from shared.blobs import BlobStore
from shared.events import EventBase
from shared.periodic import every
from shared.redis_client import connect_redis
from shared.secrets_store import SecretsStore
from shared.state_store import TaskStateStore
from shared.workspace import RepositoryRecords, WorkspaceTransfers

from .bindings import ActionLedger, TaskBindings
from .checkpoint_store import CheckpointStore
from .checkpoints import Checkpoints
from .containers import DockerSandboxes
from .execution import Execution
from .mcp_calls import McpCalls
from .order_check import OrderCheck
from .pool import WarmPool
from .recent_actions import RecentActions
from .repository_checkout import RepositoryCheckout
from .retention import KeptSandboxes, Retention
from .seating import Publish, Resend, Seating
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_secrets import TaskSecrets
from .task_status import TaskStatus
from .upkeep import Upkeep
from .workspace_ops import RuntimeWorkspace

__all__ = ["Engine", "RuntimeService"]

log = logging.getLogger("deckhands.runtime")

# How often each replica looks for free seats to give to queued tasks (a release also looks).
_ADMIT_EVERY_S = 1.0


# Makes the container engine of a process (its settings, its process id): Docker's, or a fake
# in the unit tests (tests/fakes/engine.py).
Engine = Callable[[RuntimeSettings, str], DockerSandboxes]


def _process_id(replica: str) -> str:
    """This process among those of its replica name (they may share one engine): the creator
    label of its warm sandboxes, the owner of its claims."""
    return f"{replica}-{secrets.token_hex(4)}"


class RuntimeService:
    def __init__(
        self,
        settings: RuntimeSettings,
        publish: Publish,
        resend: Resend | None = None,
        blobs: BlobStore | None = None,
        transfers: WorkspaceTransfers | None = None,
        engine: Engine = DockerSandboxes,
        checkpoint_store: CheckpointStore | None = None,
    ) -> None:
        self.settings = settings
        self.publish = publish
        # The name orders are routed by (one per engine), and this process's own id.
        self.replica = settings.replica()
        self.replica_id = _process_id(self.replica)
        self.docker = engine(settings, self.replica_id)
        self.pool = WarmPool(settings, self.docker)
        self.redis = connect_redis(settings.redis_url, settings)  # connects at its first use
        self.bindings = TaskBindings(
            self.redis, settings.pool_name, settings.binding_ttl_s, self.replica
        )
        self.ledger = ActionLedger(self.redis, settings.dedup_ttl_s)
        self.tasks = TaskSandboxes(self.pool, self.docker, self.bindings)
        self.seats = SandboxSeats(
            self.redis,
            settings.pool_name,
            settings.max_sandboxes,
            max_starting=settings.max_starting_sandboxes,
            start_stale_s=2 * settings.start_timeout_s,
        )
        states = TaskStateStore(self.redis)
        self.status = TaskStatus(states)
        self.recent = RecentActions()
        self.secrets = TaskSecrets(SecretsStore.from_settings(self.redis, settings))
        self.mcp = McpCalls(settings.mcp_servers, settings.output_limit)

        # Through self.publish at call time: tests capture what the service publishes.
        def publish_now(event: EventBase) -> Awaitable[None]:
            return self.publish(event)

        self.publish_now = publish_now

        self.orders = OrderCheck(states, publish_now)
        self.kept = KeptSandboxes(Retention(self.redis, settings.pool_name), self.tasks, settings)
        self.checkouts = RepositoryCheckout(
            RepositoryRecords(self.redis), self.secrets, self.docker, settings
        )
        self.seating = self._seating(publish_now, resend)
        # Checkpoints of /workspace after actions (issue 28): with a checkpoint store only.
        self.checkpoints = (
            None
            if checkpoint_store is None
            else Checkpoints(settings, checkpoint_store, self.redis, publish_now)
        )
        if self.checkpoints is not None:
            self.seating.before_release = self.checkpoints.let_go
            self.checkouts.checked_out = self.checkpoints.after_checkout
        self.tasks.on_settled = self.seating.start_settled
        self.tasks.start_terms = self.seating.start_terms
        self.execution = self._execution(publish_now, blobs)
        # A task's files in and out (workspace_ops.py).
        self.workspace = self._workspace(transfers)
        self.upkeep = self._upkeep()
        self._connected = False
        self._heartbeat: asyncio.Task[None] | None = None
        self._admitter: asyncio.Task[None] | None = None
        self._recoverer: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    # -- the jobs, each given its collaborators

    def _seating(self, publish: Publish, resend: Resend | None) -> Seating:
        return Seating(
            self.settings,
            self.seats,
            self.pool,
            self.tasks,
            self.bindings,
            self.ledger,
            self.status,
            self.kept,
            self.checkouts,
            self.secrets,
            publish,
            resend,
        )

    def _execution(self, publish: Publish, blobs: BlobStore | None) -> Execution:
        return Execution(
            self.settings,
            self.replica,
            self.replica_id,
            self.orders,
            self.seating,
            self.tasks,
            self.ledger,
            self.recent,
            self.checkouts,
            self.secrets,
            self.mcp,
            publish,
            blobs,
            self.checkpoints,
        )

    def _workspace(self, transfers: WorkspaceTransfers | None) -> RuntimeWorkspace:
        return RuntimeWorkspace(
            self.settings,
            self.docker,
            self.tasks,
            self.bindings,
            self.seats,
            self.status,
            self.kept,
            self.checkouts,
            transfers,
            self.publish_now,
        )

    def _upkeep(self) -> Upkeep:
        return Upkeep(
            self.settings,
            self.replica_id,
            self.docker,
            self.pool,
            self.tasks,
            self.bindings,
            self.seats,
            self.status,
            self.seating,
            self.kept,
            self.workspace,
        )

    # -- life cycle

    async def start(self) -> None:
        await self.docker.check()
        await self.redis.ping()
        self._connected = True
        await self.upkeep.send_heartbeats()
        self._heartbeat = asyncio.create_task(self.upkeep.beat(), name="runtime-heartbeat")
        marker = self.bindings.marker(self.replica_id)
        token = await marker.begin_pass()
        await self.upkeep.reconcile()
        await self.seating.hold_bound_seats()
        await marker.end_pass(token)  # a loss meanwhile: the upkeep binds them again
        self._admitter = asyncio.create_task(
            every(_ADMIT_EVERY_S, self.seating.admit_queued, "admitting queued tasks", log),
            name="runtime-admission",
        )
        self._recoverer = asyncio.create_task(
            every(
                _ADMIT_EVERY_S,
                self.upkeep.readopt_after_redis_loss,
                "re-adopting sandboxes",
                log,
            ),
            name="runtime-redis-recovery",
        )
        if self.checkpoints is not None:
            self._sweeper = asyncio.create_task(
                every(
                    self.settings.checkpoint_sweep_interval_s,
                    self.checkpoints.sweep,
                    "removing checkpoints past their retention",
                    log,
                ),
                name="runtime-checkpoint-retention",
            )
        self.pool.periodic = self.upkeep.run
        self.pool.start()
        log.info(
            "runtime %s started (pool %s, image %s)",
            self.replica_id,
            self.settings.pool_name,
            self.settings.sandbox_image,
        )

    async def stop(self) -> None:
        """Stop the pool and remove idle sandboxes; task sandboxes stay for adoption."""
        for background in (self._heartbeat, self._admitter, self._recoverer, self._sweeper):
            if background is not None:
                background.cancel()
                with contextlib.suppress(BaseException):
                    await background
        await self.pool.stop()
        await self.mcp.close()
        if self._connected:
            with contextlib.suppress(Exception):
                await self.bindings.replica_gone(self.replica_id)
        await self.redis.aclose()
        await self.docker.egress_folders.close()
        self.docker.close()
