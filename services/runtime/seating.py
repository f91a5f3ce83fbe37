"""A task's seat and its sandbox, taken together and given back together.

The pool has `max_sandboxes` seats, shared fairly across tenants (shared/admission.py). A task
takes one with its first order (`seated`) or its preparation (`prepare`); when every seat is
taken its order waits in the queue, and is sent again once a seat is free for it
(`admit_queued`). Its end (`release`) removes its sandbox, or keeps it paused for its workspace
(retention.py), and gives the seat to the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Annotated

from pydantic import Field, TypeAdapter

from shared.admission import SandboxSeats
from shared.commands import ExecuteAction, PrepareSandbox, ReleaseSandbox
from shared.events import EventBase, EventSource, SandboxQueuedObservation, TaskPriority

from .bindings import ActionLedger, TaskBindings
from .errors import (
    CheckoutFailed,
    HeldElsewhere,
    PoolExhausted,
    SandboxStartError,
    WorkspaceLost,
)
from .metrics import PREPARED, observe_seatings, publish_seat_gauges
from .pool import WarmPool
from .repository_checkout import RepositoryCheckout
from .retention import KeptSandboxes
from .sandbox_shape import shape_for
from .sandbox_starts import ANYONE, StartTerms
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_secrets import TaskSecrets
from .task_status import TaskStatus

__all__ = ["Publish", "Resend", "Seating"]

log = logging.getLogger("deckhands.runtime")

Publish = Callable[[EventBase], Awaitable[None]]
Resend = Callable[[ExecuteAction | PrepareSandbox], Awaitable[None]]

# An order kept while its task queued: an action, or the preparation of its sandbox.
_QUEUED_ORDER: TypeAdapter[ExecuteAction | PrepareSandbox] = TypeAdapter(
    Annotated[ExecuteAction | PrepareSandbox, Field(discriminator="kind")]
)


class Seating:
    def __init__(
        self,
        settings: RuntimeSettings,
        seats: SandboxSeats,
        pool: WarmPool,
        tasks: TaskSandboxes,
        bindings: TaskBindings,
        ledger: ActionLedger,
        status: TaskStatus,
        kept: KeptSandboxes,
        checkouts: RepositoryCheckout,
        secrets: TaskSecrets,
        publish: Publish,
        resend: Resend | None = None,
    ) -> None:
        self.settings = settings
        self.seats = seats
        self.pool = pool
        self.tasks = tasks
        self.bindings = bindings
        self.ledger = ledger
        self.status = status
        self.kept = kept
        self.checkouts = checkouts
        self.secrets = secrets
        self.publish = publish
        self.resend = resend  # sends a queued task's order again once it has a seat
        # Awaited before a sandbox is released (checkpoints.py: its last checkpoint done, and
        # nothing of the task kept in memory after).
        self.before_release: Callable[[str], Awaitable[None]] | None = None

    # -- taking a seat

    async def seated(self, command: ExecuteAction) -> bool:
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

    async def admit_queued(self) -> int:
        """Give free seats to the queued tasks the fair order names and send their orders
        again."""
        try:
            return await self._send_seated_orders()
        finally:
            # Last: the reasoner reads it (shared/seat_states.py); nothing above waits on it.
            await self.seats.announce()

    async def _send_seated_orders(self) -> int:
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

    async def start_settled(self, task_id: str) -> None:
        """The task's sandbox started (or could not): the next queued task may start one.
        Never raises: it runs on the way out of a start or an action, whose outcome stands (a
        start left counted stops counting after start_stale_s; the periodic pump seats on)."""
        try:
            if await self.seats.started(task_id):
                await self.admit_queued()
        except Exception as exc:
            log.warning("task %s: the next queued task was not seated now: %s", task_id, exc)

    async def start_terms(self, task_id: str) -> StartTerms:
        """What the task's first sandbox start goes by (sandbox_starts.py): its tenant's turn
        among the starts, and the warm sandboxes it leaves in the pool: the pool's floor
        (pool_min_idle) for the rest of a burst (seated while one of its kind still started)
        and for the head of a backlog; none for a burst's first task, or one that went ahead
        of a backlog. During a flood the warm sandboxes are thus there for a quiet tenant's
        task (or an interactive one), which starts at once instead of waiting for a start
        among the flood's."""
        try:
            seat = await self.seats.seat_of(task_id)
        except Exception as exc:  # then as any task: a warm sandbox if one is there
            log.warning("task %s: its seat could not be read: %s", task_id, exc)
            return ANYONE
        return StartTerms(
            tenant=seat.tenant if seat.tenant is not None else ANYONE.tenant,
            priority=TaskPriority.BATCH if seat.batch else TaskPriority.INTERACTIVE,
            leave_idle=self.settings.pool_min_idle if seat.leaves_warm else 0,
        )

    async def hold_bound_seats(self) -> None:
        """Every running task sandbox holds a seat (after an upgrade, or a Redis that lost the
        seats): new tasks are admitted only into what is left, even when that is nothing."""
        for task_id, container_id in (await self.bindings.all()).items():
            if await self.bindings.stopped_at(container_id) is None and not (
                await self.status.is_over(task_id)
            ):
                await self.seats.hold(task_id, await self.status.tenant_of(task_id))

    # -- a task's sandbox ahead of its first action, and at its end

    async def prepare(self, command: PrepareSandbox) -> None:
        """Bind the task's sandbox ahead of its first action, if a seat is free now. Never an
        error: the first action acquires (or queues for) a sandbox anyway."""
        task_id = command.task_id
        if self.tasks.local(task_id) is not None or await self.bindings.get(task_id) is not None:
            # Sent again once seated, while its first action got the sandbox first.
            await self.seats.handled_order(task_id, command.model_dump_json())
            return
        if not await self.status.is_live(task_id):
            return  # ended already (or unknown): its release may have come first
        if command.network_egress and not self.settings.allow_network_egress:
            return  # its action will be refused with the reason
        if command.network is not None and not self.settings.egress_folders_kept:
            return  # the same
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
        shape = shape_for(
            self.settings,
            task_id,
            tenant_id=command.tenant_id,
            network_egress=command.network_egress,
            network=command.network,
            workspace_mib=command.workspace_mib,
        )
        try:
            sandbox = await self.tasks.get(task_id, shape)
            # The repository is fetched while the agent thinks (a failure: the first action
            # tries again, and ends the task with the reason).
            await self.checkouts.ensure(task_id, sandbox)
        except CheckoutFailed as exc:
            log.info("task %s: repository not checked out ahead: %s", task_id, exc)
        except (SandboxStartError, PoolExhausted, WorkspaceLost, HeldElsewhere) as exc:
            log.info(
                "task %s: sandbox not prepared ahead (%s); its first action will try", task_id, exc
            )
            return
        PREPARED.inc()
        if not await self.status.is_live(task_id):
            await self.release(ReleaseSandbox(task_id=task_id, reason="ended while preparing"))

    async def release(self, command: ReleaseSandbox) -> None:
        """Remove (or keep, paused) the ended task's sandbox and free its seat. HeldElsewhere:
        another replica, alive, holds it (its engine has it): the order is theirs."""
        holder = await self.tasks.held_elsewhere(command.task_id)
        if holder is not None:
            raise HeldElsewhere(command.task_id, holder)
        if self.before_release is not None:
            await self.before_release(command.task_id)  # its last checkpoint, taken first
        if await self.status.is_over(command.task_id) and await self.kept.retain(command.task_id):
            # Ended: its sandbox is kept paused for its workspace, its seat freed now.
            if await self.seats.release(command.task_id):
                await self.admit_queued()
            # After the seat went to the queue: the pool's oldest kept sandbox, if it now keeps
            # one too many.
            await self.kept.evict_beyond_cap(self.status.is_over)
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
