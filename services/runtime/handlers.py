"""The runtime's message entry points: the work orders and the workspace requests its
subscribers (main.py) receive, each handed to the part that does it.

An order or a workspace request whose task's sandbox another replica's engine holds (that
replica alive) is that replica's: it is passed on to it.
"""

from __future__ import annotations

import logging
from typing import Annotated

from faststream.nats import NatsBroker
from pydantic import Field

from shared.broker import handled_message
from shared.commands import (
    CheckpointWorkspace,
    ExecuteAction,
    ForgetTaskRequest,
    PrepareSandbox,
    ReleaseSandbox,
)
from shared.workspace import WORKSPACE_SUBJECT, WorkspaceReply, WorkspaceRequest

from .checkpoint_point import CheckpointPoint
from .errors import HeldElsewhere
from .execution import Execution
from .repository_checkout import RepositoryCheckout
from .routing import ReplicaQueues, relay_id
from .seating import Seating
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .workspace_ops import RuntimeWorkspace

__all__ = ["RuntimeHandlers", "RuntimeWork"]

log = logging.getLogger("deckhands.runtime")

RuntimeWork = Annotated[
    ExecuteAction | PrepareSandbox | ReleaseSandbox | CheckpointWorkspace,
    Field(discriminator="kind"),
]


class RuntimeHandlers:
    def __init__(
        self,
        broker: NatsBroker,
        settings: RuntimeSettings,
        queues: ReplicaQueues,
        execution: Execution,
        seating: Seating,
        workspace: RuntimeWorkspace,
        tasks: TaskSandboxes,
        checkouts: RepositoryCheckout,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.queues = queues
        self.execution = execution
        self.seating = seating
        self.workspace = workspace
        self.tasks = tasks
        self.checkouts = checkouts

    # -- a deleted task (the deletions stream, one consumer shared by the replicas)

    async def on_deletion(self, request: ForgetTaskRequest) -> None:
        await self.checkouts.forget(request.task_id)
        removed = 0
        if self.execution.checkpoints is not None:
            removed = await self.execution.checkpoints.remove(request.task_id)
        log.info(
            "task %s deleted: its checkout's records and %d checkpoint objects removed",
            request.task_id,
            removed,
        )

    # -- work orders: on the shared subject, and on this replica's own

    async def on_work(self, body: RuntimeWork) -> None:
        await self._handle(body)

    async def on_routed(self, body: RuntimeWork) -> None:
        await self._handle(body)

    async def _handle(self, body: RuntimeWork) -> None:
        try:
            if isinstance(body, ReleaseSandbox):
                await self.seating.release(body)
                return
            if isinstance(body, PrepareSandbox):
                await self.seating.prepare(body)
                return
            if isinstance(body, CheckpointWorkspace):
                await self._checkpoint(body)
                return
            msg = handled_message(self.broker)
            delivered = msg.raw_message.metadata.num_delivered
            await self.execution.execute(
                body, progress=msg.in_progress, last_try=delivered >= self.settings.max_deliveries
            )
        except HeldElsewhere as elsewhere:
            await self._pass_on(body, elsewhere.replica)

    async def _checkpoint(self, order: CheckpointWorkspace) -> None:
        """An upload's checkpoint, taken in the task's running sandbox (on the replica whose
        engine holds it); a sandbox kept paused or stopped, or bound afresh, has its next
        action take it (the action carries its seq)."""
        checkpoints = self.execution.checkpoints
        if checkpoints is None or not self.settings.checkpoints:
            return
        holder = await self.tasks.held_elsewhere(order.task_id)
        if holder is not None:
            raise HeldElsewhere(order.task_id, holder)
        point = CheckpointPoint.after_upload(order)
        sandbox = self.tasks.local(order.task_id)
        if sandbox is None or sandbox.lost or (sandbox.fresh and order.checkpoint_seq):
            # Not running here, or its files not yet back from its checkpoint.
            await self.execution.publish(checkpoints.not_running(point))
            return
        sandbox.fresh = False  # a first sandbox: its files are the task's own
        checkpoints.take(point, sandbox)

    async def _pass_on(self, order: RuntimeWork, to: str) -> None:
        """The task's sandbox is on the engine of replica `to`, alive: the order is its."""
        meta = handled_message(self.broker).raw_message.metadata
        msg_id = relay_id(order.id, meta.stream, meta.sequence.stream)
        await self.queues.forward(order.task_id, order.model_dump_json(), to, msg_id)
        log.info("task %s: %s passed on to runtime replica %s", order.task_id, order.kind, to)

    # -- workspace requests (request/reply)

    async def on_workspace(self, body: WorkspaceRequest) -> WorkspaceReply:
        holder = await self.tasks.held_elsewhere(body.task_id)
        if holder is None:
            try:
                return await self.workspace.handle(body)
            except HeldElsewhere as elsewhere:
                holder = elsewhere.replica
        # The sandbox is on that replica's engine: it answers (the gateway's request is bounded
        # by the gateway's own timeout).
        reply = await self.broker.request(
            body.model_dump_json().encode(),
            f"{WORKSPACE_SUBJECT}.{holder}",
            timeout=self.settings.workspace_forward_timeout_s,
        )
        return WorkspaceReply.model_validate_json(reply.body)

    async def on_own_workspace(self, body: WorkspaceRequest) -> WorkspaceReply:
        return await self.workspace.handle(body)
