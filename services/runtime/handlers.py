"""The runtime-executor's logic: run approved actions in task sandboxes, release sandboxes.

One RuntimeService per process. `start` does the I/O (Redis, Docker, reconciliation, warm pool);
`execute` and `release` are what the subscriber calls for each work order.

Execution is at most once per action id: the action is marked started in Redis just before it
reaches the sandbox, and its observation is recorded before it is published. A redelivery
republishes the recorded observation; a duplicate that arrives while the action runs waits for
it; an action whose runner died midway is reported as interrupted, never run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated

from pydantic import Field, TypeAdapter
from redis.asyncio import Redis

from shared.admission import SandboxSeats
from shared.blobs import BlobStore
from shared.commands import ExecuteAction, PrepareSandbox, ReleaseSandbox
from shared.delivery import PermanentError
from shared.events import (
    SANDBOX_ENDING_STATES,
    AgentState,
    CmdOutputObservation,
    EventAdapter,
    EventBase,
    EventSource,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    MCPCallAction,
    PythonOutputObservation,
    SandboxQueuedObservation,
    TaskPriority,
)
from shared.periodic import every
from shared.redis_client import connect_redis
from shared.sandbox_protocol.session import answers
from shared.secret_redaction import Redactor
from shared.secrets_store import SecretsStore
from shared.state import Awaiting
from shared.state_store import TaskStateStore
from shared.waiting import wait_up_to

from .actions import RuntimeObservation, error_observation, run_action
from .bindings import ActionLedger, TaskBindings
from .containers import DockerSandboxes, Sandbox
from .errors import (
    CheckoutFailed,
    HeldElsewhere,
    PoolExhausted,
    SandboxLost,
    SandboxStartError,
    WorkspaceLost,
)
from .mcp_calls import McpCalls
from .metrics import (
    ACTION_SECONDS,
    ACTIONS,
    PREPARED,
    observe_seatings,
    publish_seat_gauges,
)
from .order_check import OrderCheck
from .pool import WarmPool
from .recent_actions import RecentActions
from .reconcile import ReconcileReport, reconcile, reconcile_quietly
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_secrets import TaskSecrets
from .workspace_ops import RuntimeWorkspace

__all__ = ["Publish", "RuntimeService"]

log = logging.getLogger("deckhands.runtime")

Publish = Callable[[EventBase], Awaitable[None]]
Resend = Callable[[ExecuteAction | PrepareSandbox], Awaitable[None]]
Progress = Callable[[], Awaitable[None]]

_CLAIM_TTL_S = 15
_CLAIM_REFRESH_S = 5.0
_WAITING_FOR_USER = frozenset(
    {
        AgentState.AWAITING_USER_INPUT,
        AgentState.AWAITING_USER_CONFIRMATION,
        AgentState.PAUSED,
        AgentState.ERROR,
    }
)


def _process_id(replica: str) -> str:
    """This process among those of its replica name (they may share one engine): the creator
    label of its warm sandboxes, the owner of its claims."""
    return f"{replica}-{secrets.token_hex(4)}"


def _with_notice(sandbox: Sandbox, observation: RuntimeObservation) -> RuntimeObservation:
    """Put a pending notice before a command's or cell's output (never into file contents)."""
    if sandbox.notice is None or not isinstance(
        observation, CmdOutputObservation | PythonOutputObservation
    ):
        return observation
    notice, sandbox.notice = sandbox.notice, None
    return observation.model_copy(update={"content": f"{notice}\n{observation.content}"})


# Run by the executor's files part: a slow one is not a dead sandbox.
_FILE_ACTIONS = (FileReadAction, FileWriteAction, FileEditAction)

# How often each replica looks for free seats to give to queued tasks (a release also looks).
_ADMIT_EVERY_S = 1.0
# An order kept while its task queued: an action, or the preparation of its sandbox.
_QUEUED_ORDER: TypeAdapter[ExecuteAction | PrepareSandbox] = TypeAdapter(
    Annotated[ExecuteAction | PrepareSandbox, Field(discriminator="kind")]
)


class RuntimeService:
    def __init__(
        self,
        settings: RuntimeSettings,
        publish: Publish,
        resend: Resend | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.settings = settings
        self.publish = publish
        self.resend = resend  # sends a queued task's order again once it has a seat
        self.blobs = blobs  # whole outputs, large writes (None: cut outputs only)
        # The name orders are routed by (one per engine), and this process's own id.
        self.replica = settings.replica()
        self.replica_id = _process_id(self.replica)
        self.docker = DockerSandboxes(settings, self.replica_id)
        self.pool = WarmPool(settings, self.docker)
        self._redis: Redis | None = None
        self._bindings: TaskBindings | None = None
        self._ledger: ActionLedger | None = None
        self._tasks: TaskSandboxes | None = None
        self._states: TaskStateStore | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._seats: SandboxSeats | None = None
        self._orders: OrderCheck | None = None
        self._admitter: asyncio.Task[None] | None = None
        self._recoverer: asyncio.Task[None] | None = None
        self.recent = RecentActions()
        self.workspace = RuntimeWorkspace(self)  # in and out, repositories (workspace_ops.py)
        self.secrets = TaskSecrets(None)
        self.mcp = McpCalls(settings.mcp_servers, settings.output_limit)

    # -- parts that exist once started

    @property
    def bindings(self) -> TaskBindings:
        assert self._bindings is not None, "RuntimeService.start() was not called"
        return self._bindings

    @property
    def ledger(self) -> ActionLedger:
        assert self._ledger is not None, "RuntimeService.start() was not called"
        return self._ledger

    @property
    def orders(self) -> OrderCheck:
        assert self._orders is not None, "RuntimeService.start() was not called"
        return self._orders

    @property
    def seats(self) -> SandboxSeats:
        assert self._seats is not None, "RuntimeService.start() was not called"
        return self._seats

    @property
    def tasks(self) -> TaskSandboxes:
        assert self._tasks is not None, "RuntimeService.start() was not called"
        return self._tasks

    # -- life cycle

    async def start(self) -> None:
        await self.docker.check()
        self._redis = connect_redis(self.settings.redis_url, self.settings)
        await self._redis.ping()
        self._bindings = TaskBindings(
            self._redis, self.settings.pool_name, self.settings.binding_ttl_s, self.replica
        )
        self._ledger = ActionLedger(self._redis, self.settings.dedup_ttl_s)
        self._states = TaskStateStore(self._redis)
        self.workspace.start(self._redis)
        self.secrets = TaskSecrets(SecretsStore.from_settings(self._redis, self.settings))
        # Through self.publish at call time: tests capture what the service publishes.
        self._orders = OrderCheck(self._states, lambda event: self.publish(event))
        self._tasks = TaskSandboxes(self.pool, self.docker, self._bindings)
        self._seats = SandboxSeats(
            self._redis,
            self.settings.pool_name,
            self.settings.max_sandboxes,
            max_starting=self.settings.max_starting_sandboxes,
            start_stale_s=2 * self.settings.start_timeout_s,
        )
        self._tasks.on_settled = self._start_settled
        await self._send_heartbeats()
        self._heartbeat = asyncio.create_task(self._beat(), name="runtime-heartbeat")
        await self.reconcile()
        await self._hold_bound_seats()
        await self.bindings.mark_intact(self.replica_id)
        self._admitter = asyncio.create_task(
            every(_ADMIT_EVERY_S, self.admit_queued, "admitting queued tasks", log),
            name="runtime-admission",
        )
        self._recoverer = asyncio.create_task(
            every(_ADMIT_EVERY_S, self.readopt_after_redis_loss, "re-adopting sandboxes", log),
            name="runtime-redis-recovery",
        )
        self.pool.periodic = self._upkeep
        self.pool.start()
        log.info(
            "runtime %s started (pool %s, image %s)",
            self.replica_id,
            self.settings.pool_name,
            self.settings.sandbox_image,
        )

    async def stop(self) -> None:
        """Stop the pool and remove idle sandboxes; task sandboxes stay for adoption."""
        for background in (self._heartbeat, self._admitter, self._recoverer):
            if background is not None:
                background.cancel()
                with contextlib.suppress(BaseException):
                    await background
        await self.pool.stop()
        await self.mcp.close()
        if self._bindings is not None:
            with contextlib.suppress(Exception):
                await self._bindings.replica_gone(self.replica_id)
        if self._redis is not None:
            await self._redis.aclose()
        self.docker.close()

    async def _send_heartbeats(self) -> None:
        ttl_s = self.settings.replica_ttl_s
        await self.bindings.heartbeat(self.replica_id, ttl_s)
        await self.bindings.name_heartbeat(ttl_s)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.replica_ttl_s / 3)
            try:
                await self._send_heartbeats()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _upkeep(self) -> None:
        await reconcile_quietly(self.reconcile)
        try:
            await self.stop_idle_sandboxes()
        except Exception:
            log.exception("stopping idle sandboxes failed")
        try:
            await self.free_stale_seats()
        except Exception:
            log.exception("freeing the seats of ended tasks failed")
        try:
            await self.workspace.sweep(self._task_is_over, self._task_is_gone)
        except Exception:
            log.exception("removing the kept sandboxes of ended tasks failed")

    async def stop_idle_sandboxes(self) -> int:
        """Stop the sandboxes of tasks that wait (for a person, or, while others queue for a
        seat, for a sub-task) and ran nothing for a while; their seats go to the queue."""
        s = self.settings
        if self._states is None:
            return 0
        _, queued = await self.seats.counts()
        idle_s = s.sandbox_idle_stop_s
        if queued:
            idle_s = min(idle_s or s.queue_preempt_after_s, s.queue_preempt_after_s)
        if idle_s is None:
            return 0
        stopped = 0
        for task_id in self.tasks.idle_since(idle_s):
            state = await self._states.load(task_id)
            if state is None:
                continue
            # Only while the task waits for a person (or a sub-task): then no action can be on
            # its way.
            waits = state.agent_state in _WAITING_FOR_USER or (
                queued and state.awaiting is Awaiting.DELEGATE
            )
            if waits and await self.tasks.stop_idle(task_id, idle_s):
                stopped += 1
                await self.seats.release(task_id)
        if stopped:
            await self.admit_queued()
        return stopped

    async def free_stale_seats(self) -> int:
        """Seats of tasks that ended (or vanished) while their release was lost (a crash):
        release them as the task's end would, the sandbox first, so that the seat is never
        free while the sandbox still runs."""
        freed = 0
        for task_id in await self.seats.seated():
            if await self._task_is_over(task_id) or await self._task_is_gone(task_id):
                try:
                    await self.release(ReleaseSandbox(task_id=task_id, reason="ended; seat freed"))
                except HeldElsewhere:
                    continue  # its holder, alive, frees it
                freed += 1
        if freed:
            log.info("released %d seats of tasks that ended", freed)
        return freed

    async def _task_is_gone(self, task_id: str) -> bool:
        """The task has no State, and not because Redis lost it: while the controller has not
        rebuilt the States of a Redis that lost them, a missing one proves nothing."""
        if self._states is None or await self._states.load(task_id) is not None:
            return False
        return await self._states.intact()

    async def readopt_after_redis_loss(self) -> int:
        """When Redis lost what it held (a FLUSHALL, a new Redis: this replica's marker is
        gone), bind this replica's task sandboxes again and hold their seats: their tasks keep
        their workspaces, and new tasks are admitted only into the seats that are left.

        Other replicas do the same for theirs; a task sandbox nobody holds in memory (its
        replica restarted meanwhile) is bound again by reconciliation, by its name, once the
        controller has rebuilt its task's State. What Redis held for queued tasks is gone: the
        controller sends their order again when it rebuilds their State."""
        if await self.bindings.intact(self.replica_id):
            return 0
        # Alive again first: another replica must not take the sandboxes bound again below for
        # a gone replica's.
        await self._send_heartbeats()
        readopted = 0
        for task_id, sandbox in self.tasks.tasks().items():
            if sandbox.lost:
                continue
            if await self.bindings.bind(task_id, sandbox.container_id) == sandbox.container_id:
                await self.seats.hold(task_id, await self._tenant_of(task_id))
                readopted += 1
        await self.bindings.mark_intact(self.replica_id)
        log.warning("Redis lost the runtime's records: %d task sandboxes bound again", readopted)
        return readopted

    # -- admission

    async def _hold_bound_seats(self) -> None:
        """Every running task sandbox holds a seat (after an upgrade, or a Redis that lost the
        seats): new tasks are admitted only into what is left, even when that is nothing."""
        for task_id, container_id in (await self.bindings.all()).items():
            if await self.bindings.stopped_at(container_id) is None and not (
                await self._task_is_over(task_id)
            ):
                await self.seats.hold(task_id, await self._tenant_of(task_id))

    async def _tenant_of(self, task_id: str) -> str | None:
        """Whose share a seat held by the task counts against (None: unknown yet)."""
        if self._states is None:
            return None
        try:
            state = await self._states.load(task_id)
        except Exception:  # an unreadable State: counted as nobody's, still counted
            return None
        return None if state is None else state.tenant_id

    async def admit_queued(self) -> int:
        """Give free seats to the queued tasks the fair order names and send their orders
        again."""
        orders, seatings = await self.seats.pump()
        observe_seatings(seatings)
        taken, queued, starting = await self.seats.census()
        publish_seat_gauges(taken, queued, await self.seats.tenants(), starting)
        # Tasks that wait for a seat to free (not merely for their turn to start) get warm
        # sandboxes ready, so whoever is seated next does not wait for a start.
        self.pool.expect_queued(queued if taken >= self.seats.max_seats else 0)
        if self.resend is None:
            return 0
        for raw in orders:
            try:
                order = _QUEUED_ORDER.validate_json(raw)
            except ValueError as exc:  # written by an older replica: nothing to send
                log.error("dropping an unreadable queued order: %s", exc)
                continue
            await self.resend(order)
            log.info(
                "task %s: seated from the queue, its %s is sent again", order.task_id, order.kind
            )
        return len(orders)

    async def _start_settled(self, task_id: str) -> None:
        """The task's sandbox started (or could not): the next queued task may start one.
        Never raises: it runs on the way out of a start or an action, whose outcome stands (a
        start left counted stops counting after start_stale_s; the periodic pump seats on)."""
        try:
            if await self.seats.started(task_id):
                await self.admit_queued()
        except Exception as exc:
            log.warning("task %s: the next queued task was not seated now: %s", task_id, exc)

    async def _seated(self, command: ExecuteAction) -> bool:
        """Whether the task holds (or now takes) a seat; if not, its order waits in the queue
        and the controller is told the task's place."""
        task_id = command.task_id
        local = self.tasks.local(task_id)
        if (local is not None and not local.lost) or (
            await self.ledger.result(command.action.id) is not None  # ran: published again
        ):
            # An action kept in the queue may come back after its task's preparation started
            # the sandbox: then it is handled here, and must not be sent again.
            await self.seats.handled_order(task_id, command.model_dump_json())
            return True
        bound = await self.bindings.get(task_id)
        if bound is not None and await self.bindings.stopped_at(bound) is None:
            # Running (another replica's, or adopted).
            await self.seats.hold(task_id, command.tenant_id)
            return True
        admission = await self.seats.admit(
            task_id,
            command.model_dump_json(),
            tenant_id=command.tenant_id,
            batch=command.priority is TaskPriority.BATCH,
        )
        observe_seatings(admission.seatings)
        if len(admission.seatings) > admission.seated:
            await self.admit_queued()  # others were seated too: their orders go out now
        if admission.seated:
            await self.seats.handled(task_id)
            return True
        log.info("task %s: every seat is taken, queued at position %d", task_id, admission.position)
        await self.publish(
            SandboxQueuedObservation(
                id=f"queued-{command.id}",
                task_id=task_id,
                source=EventSource.ENVIRONMENT,
                cause=command.action.id,
                position=admission.position,
                max_sandboxes=self.seats.max_seats,
            )
        )
        return False

    async def reconcile(self) -> ReconcileReport:
        return await reconcile(
            self.docker,
            self.bindings,
            self.pool,
            self.tasks,
            self.replica_id,
            self._over_and_not_kept,
            self._task_is_live,
        )

    async def _over_and_not_kept(self, task_id: str) -> bool:
        """Over, and its sandbox not kept for its workspace (workspace_ops.Retention)."""
        return await self._task_is_over(task_id) and not await self.workspace.is_retained(task_id)

    async def task_is_live(self, task_id: str) -> bool:
        return await self._task_is_live(task_id)

    async def _task_is_live(self, task_id: str) -> bool:
        if self._states is None:
            return False
        try:
            state = await self._states.load(task_id)
        except Exception:
            return False
        return state is not None and state.agent_state not in SANDBOX_ENDING_STATES

    async def _task_is_over(self, task_id: str) -> bool:
        if self._states is None:
            return False
        try:
            state = await self._states.load(task_id)
        except Exception:  # an unreadable state is not proof that the task ended
            return False
        return state is not None and state.agent_state in SANDBOX_ENDING_STATES

    # -- work orders

    async def execute(
        self, command: ExecuteAction, progress: Progress | None = None, last_try: bool = False
    ) -> None:
        """Run the action once, record its observation, publish it to the controller."""
        action = command.action
        if action.task_id != command.task_id:
            raise PermanentError(
                f"action {action.id} belongs to task {action.task_id}, not {command.task_id}"
            )
        if not await self.orders.admit(command):
            return  # not the reviewed action its task awaits: answered, never run
        known = await self._known_here(action.id, progress)
        if known is not None:  # ran, or runs, here: Redis may have lost its ledger since
            await self.publish(EventAdapter.validate_json(known))
            return
        holder = await self.tasks.held_elsewhere(command.task_id)
        if holder is not None:
            raise HeldElsewhere(command.task_id, holder)  # the order is passed on to it
        if not await self._seated(command):
            return  # it waits in Redis for a seat, holding nothing here
        state, recorded = await self.ledger.begin(action.id, self.replica_id, _CLAIM_TTL_S)
        if state == "claimed":
            self.recent.begin(action.id)
            try:
                async with self._keepalive(action.id, progress):
                    observation = self._answer(await self._run(command, last_try))
            except BaseException:
                self.recent.abandon(action.id)
                await self.ledger.finish(action.id, self.replica_id)
                raise
            finally:
                if self.tasks.local(command.task_id) is None:
                    # Seated, yet no sandbox was started (an action that needs none, or one
                    # refused first): the seat no longer waits for a start.
                    await self._start_settled(command.task_id)
            produced = observation.model_dump_json()
            # Remembered here before Redis records it: a Redis that fails now (restarting after
            # it lost its data) must not leave a duplicate waiting for this run for ever.
            self.recent.done(action.id, produced)
            recorded = await self.ledger.complete(action.id, self.replica_id, produced)
            if recorded != produced:
                self.recent.done(action.id, recorded)  # the ledger's copy wins, as before
        elif recorded is None:
            recorded = await self._result_of_duplicate(command, progress)
        await self.publish(EventAdapter.validate_json(recorded))

    def _answer(self, observation: RuntimeObservation) -> RuntimeObservation:
        """The observation as recorded and published: naming this replica when it holds the
        task's sandbox, so that the controller routes the task's next order here; else none."""
        holds = self.tasks.local(observation.task_id) is not None
        return observation.model_copy(update={"runtime_replica": self.replica if holds else None})

    async def _known_here(self, action_id: str, progress: Progress | None) -> str | None:
        """The observation of an action this replica ran, or of its run under way here (waited
        for, telling JetStream the order is being worked on); None if it never ran here."""
        kept = self.recent.result(action_id)
        if kept is not None:
            return kept
        run = self.recent.running(action_id)
        while run is not None and not run.done():
            try:
                await wait_up_to(_CLAIM_REFRESH_S, asyncio.shield(run))
            except asyncio.CancelledError:
                if not run.cancelled():
                    raise  # we are cancelled, not the run
            if progress is not None and not run.done():
                await progress()
        if run is None or run.cancelled():
            return None
        return run.result()

    async def prepare(self, command: PrepareSandbox) -> None:
        """Bind the task's sandbox ahead of its first action, if a seat is free now. Never an
        error: the first action acquires (or queues for) a sandbox anyway."""
        task_id = command.task_id
        if self.tasks.local(task_id) is not None or await self.bindings.get(task_id) is not None:
            # Sent again once seated, while its first action got the sandbox first.
            await self.seats.handled_order(task_id, command.model_dump_json())
            return
        if not await self._task_is_live(task_id):
            return  # ended already (or unknown): its release may have come first
        if command.network_egress and not self.settings.allow_network_egress:
            return  # its action will be refused with the reason
        # Kept with its place in the queue: once seated, the order comes back and the sandbox
        # starts then, ahead of the task's first action if it has not come yet.
        admission = await self.seats.admit(
            task_id,
            command.model_dump_json(),
            tenant_id=command.tenant_id,
            batch=command.priority is TaskPriority.BATCH,
            weak=True,
        )
        observe_seatings(admission.seatings)
        if len(admission.seatings) > admission.seated:
            await self.admit_queued()
        if not admission.seated:
            return
        network = self.settings.sandbox_network_name if command.network_egress else None
        try:
            sandbox = await self.tasks.get(
                task_id, network, self.settings.task_workspace_bytes(command.workspace_mib)
            )
            # The repository is fetched while the agent thinks (a failure: the first action
            # tries again, and ends the task with the reason).
            await self.workspace.ensure_checkout(task_id, sandbox)
        except CheckoutFailed as exc:
            log.info("task %s: repository not checked out ahead: %s", task_id, exc)
        except (SandboxStartError, PoolExhausted, WorkspaceLost, HeldElsewhere) as exc:
            log.info(
                "task %s: sandbox not prepared ahead (%s); its first action will try", task_id, exc
            )
            return
        PREPARED.inc()
        if not await self._task_is_live(task_id):
            await self.release(ReleaseSandbox(task_id=task_id, reason="ended while preparing"))

    async def release(self, command: ReleaseSandbox) -> None:
        """Remove (or keep, paused) the ended task's sandbox and free its seat. HeldElsewhere:
        another replica, alive, holds it (its engine has it): the order is theirs."""
        holder = await self.tasks.held_elsewhere(command.task_id)
        if holder is not None:
            raise HeldElsewhere(command.task_id, holder)
        if await self._task_is_over(command.task_id) and await self.workspace.retain(
            command.task_id
        ):
            # Ended: its sandbox is kept paused for its workspace, its seat freed now.
            if await self.seats.release(command.task_id):
                await self.admit_queued()
            # After the seat went to the queue: the pool's oldest kept sandbox, if it now keeps
            # one too many.
            await self.workspace.evict_beyond_cap(self._task_is_over)
            return
        had = await self.tasks.release(command.task_id)
        self.secrets.forget(command.task_id)
        if await self.seats.release(command.task_id):
            await self.admit_queued()
        log.info(
            "task %s: sandbox %s (%s)",
            command.task_id,
            "released" if had else "already gone",
            command.reason or "no reason given",
        )

    async def _run(self, command: ExecuteAction, last_try: bool) -> RuntimeObservation:
        action = command.action
        kind = action.kind
        started = time.monotonic()
        if isinstance(action, MCPCallAction):  # the operator's server, no sandbox needed
            secrets = await self.secrets.of(command.task_id)
            observation = Redactor(secrets).model(await self.mcp.run(action))
            ACTIONS.labels(kind, observation.kind).inc()
            ACTION_SECONDS.labels(kind).observe(time.monotonic() - started)
            return observation
        network = None
        if command.network_egress:
            if not self.settings.allow_network_egress:
                ACTIONS.labels(kind, "egress_forbidden").inc()
                return error_observation(
                    action,
                    "This task asked for network access, but this runtime does not allow it "
                    "(DECKHANDS_ALLOW_NETWORK_EGRESS=false). The action was not run.",
                    "egress_forbidden",
                )
            network = self.settings.sandbox_network_name
        try:
            sandbox = await self.tasks.get(
                command.task_id, network, self.settings.task_workspace_bytes(command.workspace_mib)
            )
        except WorkspaceLost as exc:
            ACTIONS.labels(kind, "sandbox_lost").inc()
            return error_observation(
                action,
                f"The task's sandbox was lost ({exc}): the workspace with its files, the shell "
                "and the Python session are gone. This action was not run. The next action "
                "runs in a fresh sandbox with an empty /workspace.",
                "sandbox_lost",
            )
        except (SandboxStartError, PoolExhausted) as exc:
            if not last_try:
                raise  # transient: redelivered with backoff
            ACTIONS.labels(kind, "no_sandbox").inc()
            # The engine's words (container ids, its address) stay in the log; the pool's own
            # message says only how long it waited.
            log.error("task %s: no sandbox for action %s: %s", command.task_id, action.id, exc)
            why = f": {exc}" if isinstance(exc, PoolExhausted) else " (the engine refused it)"
            return error_observation(
                action, f"No sandbox could be started for this action{why}", "no_sandbox"
            )
        try:
            await self.workspace.ensure_checkout(command.task_id, sandbox)
        except CheckoutFailed as exc:
            # Dead-lettered at once: the controller ends the task in ERROR with this reason.
            await self.release(ReleaseSandbox(task_id=command.task_id, reason="no checkout"))
            raise PermanentError(f"the task's repository could not be checked out: {exc}") from exc
        if not await self.ledger.start(action.id):
            ACTIONS.labels(kind, "interrupted").inc()
            return self._interrupted(action)
        try:
            secrets = await self.secrets.of(command.task_id)
            observation = await run_action(
                sandbox.session, action, self.settings, self.blobs, secrets
            )
            observation = _with_notice(sandbox, observation)
            # Redacted at the source: before the ledger records it or anyone sees it.
            observation = Redactor(secrets).model(observation)
        except (SandboxLost, TimeoutError) as exc:
            if (
                isinstance(exc, TimeoutError)
                and isinstance(action, _FILE_ACTIONS)
                and await answers(sandbox.session, 5.0)
            ):
                # The executor answers: only this file operation is slow (its files part
                # stays busy with it). The workspace is kept.
                ACTIONS.labels(kind, "timeout").inc()
                return error_observation(
                    action,
                    "The file operation did not finish in time. The sandbox and its files are "
                    "fine; use a command to work with this path.",
                    "timeout",
                )
            if isinstance(exc, TimeoutError):
                log.error(
                    "task %s: sandbox %s stopped answering", command.task_id, sandbox.short_id
                )
            reason = await self.tasks.lost(command.task_id, sandbox)
            ACTIONS.labels(kind, "sandbox_lost").inc()
            return error_observation(
                action,
                f"The sandbox died while running this action ({reason}). The workspace was "
                "lost: its files, the shell and the Python session are gone, and the action "
                "may have run partly. The next action runs in a fresh sandbox with an empty "
                "/workspace.",
                "sandbox_lost",
            )
        ACTIONS.labels(kind, observation.kind).inc()
        ACTION_SECONDS.labels(kind).observe(time.monotonic() - started)
        return observation

    @staticmethod
    def _interrupted(action: EventBase) -> RuntimeObservation:
        return error_observation(
            action,
            "The runtime stopped while running this action, before it could report the "
            "result; the action may or may not have taken effect. It was not run again.",
            "action_interrupted",
        )

    async def _result_of_duplicate(self, command: ExecuteAction, progress: Progress | None) -> str:
        """Another worker runs this action now: wait for its result instead of running it."""
        action_id = command.action.id
        last_progress = time.monotonic()
        while True:
            recorded = await self.ledger.result(action_id)
            if recorded is not None:
                return recorded
            if not await self.ledger.running(action_id):
                recorded = await self.ledger.result(action_id)
                if recorded is not None:
                    return recorded
                if await self.ledger.claim(action_id, self.replica_id, _CLAIM_TTL_S):
                    try:
                        # Its runner is gone. Run it only if it never reached the sandbox.
                        observation = self._answer(await self._run(command, last_try=True))
                        return await self.ledger.record(action_id, observation.model_dump_json())
                    finally:
                        await self.ledger.finish(action_id, self.replica_id)
            if progress is not None and time.monotonic() - last_progress > _CLAIM_REFRESH_S:
                last_progress = time.monotonic()
                await progress()
            await asyncio.sleep(0.2)

    @contextlib.asynccontextmanager
    async def _keepalive(self, action_id: str, progress: Progress | None) -> AsyncIterator[None]:
        """While an action runs: keep our claim on it and tell JetStream we are still working.

        The beat is asked to stop, not cancelled: a Redis command cancelled in flight left
        redis-py's call hanging, and the action's observation with it (3 tasks of 500 under
        heavy load). Its wait is bounded either way.
        """
        done = asyncio.Event()

        async def beat() -> None:
            while True:
                await wait_up_to(_CLAIM_REFRESH_S, done.wait())
                if done.is_set():
                    return
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(_CLAIM_REFRESH_S):
                        await self.ledger.refresh(action_id, self.replica_id, _CLAIM_TTL_S)
                if progress is not None:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(_CLAIM_REFRESH_S):
                            await progress()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            done.set()
            _, late = await asyncio.wait({task}, timeout=2 * _CLAIM_REFRESH_S + 1)
            for stuck in late:
                log.warning("action %s: its keep-alive did not stop; leaving it", action_id)
                stuck.cancel()
