"""Running an approved action at most once, and answering it.

Execution is at most once per action id: the action is marked started in Redis just before it
reaches the sandbox, and its observation is recorded before it is published. A redelivery
republishes the recorded observation; a duplicate that arrives while the action runs waits for
it; an action whose runner died midway is reported as interrupted, never run again. A sandbox
that dies under an action (or stops answering) is reported to the task as lost, with its
workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from shared.blobs import BlobStore
from shared.commands import ExecuteAction, ReleaseSandbox
from shared.delivery import PermanentError
from shared.events import (
    CmdOutputObservation,
    EventAdapter,
    EventBase,
    FileEditAction,
    FileReadAction,
    FileWriteAction,
    MCPCallAction,
    PythonOutputObservation,
)
from shared.sandbox_protocol.session import answers
from shared.waiting import wait_up_to

from .actions import RuntimeObservation, error_observation, run_action
from .bindings import ActionLedger
from .checkpoint_restore import died_during_action
from .checkpoints import Checkpoints
from .containers import Sandbox
from .errors import (
    CheckoutFailed,
    HeldElsewhere,
    PoolExhausted,
    SandboxLost,
    SandboxStartError,
    WorkspaceLost,
)
from .mcp_calls import McpCalls
from .metrics import ACTION_SECONDS, ACTIONS
from .order_check import OrderCheck
from .recent_actions import RecentActions
from .repository_checkout import RepositoryCheckout
from .sandbox_shape import shape_for
from .seating import Publish, Seating
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_secrets import TaskSecrets

__all__ = ["Execution", "Progress"]

log = logging.getLogger("deckhands.runtime")

Progress = Callable[[], Awaitable[None]]

_CLAIM_TTL_S = 15
_CLAIM_REFRESH_S = 5.0


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


class Execution:
    def __init__(
        self,
        settings: RuntimeSettings,
        replica: str,
        replica_id: str,
        orders: OrderCheck,
        seating: Seating,
        tasks: TaskSandboxes,
        ledger: ActionLedger,
        recent: RecentActions,
        checkouts: RepositoryCheckout,
        secrets: TaskSecrets,
        mcp: McpCalls,
        publish: Publish,
        blobs: BlobStore | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.settings = settings
        # The name orders are routed by (one per engine), and this process's own id.
        self.replica = replica
        self.replica_id = replica_id
        self.orders = orders
        self.seating = seating
        self.tasks = tasks
        self.ledger = ledger
        self.recent = recent
        self.checkouts = checkouts
        self.secrets = secrets
        self.mcp = mcp
        self.publish = publish
        self.blobs = blobs  # whole outputs, large writes (None: cut outputs only)
        self.checkpoints = checkpoints  # of /workspace after actions (None: none taken)

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
        if not await self.seating.seated(command):
            return  # it waits in Redis for a seat, holding nothing here
        state, recorded = await self.ledger.begin(action.id, self.replica_id, _CLAIM_TTL_S)
        if state == "claimed":
            self.recent.begin(action.id)
            try:
                async with self._keepalive(action.id, progress):
                    observation = self._answer(await self.run(command, last_try))
            except BaseException:
                self.recent.abandon(action.id)
                await self.ledger.finish(action.id, self.replica_id)
                raise
            finally:
                if self.tasks.local(command.task_id) is None:
                    # Seated, yet no sandbox was started (an action that needs none, or one
                    # refused first): the seat no longer waits for a start.
                    await self.seating.start_settled(command.task_id)
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

    # -- the run itself

    async def run(self, command: ExecuteAction, last_try: bool) -> RuntimeObservation:
        """Run the action (in the task's sandbox, or on the operator's MCP server) and say what
        came of it; counted in the metrics. Not recorded: `execute` does that."""
        action = command.action
        kind = action.kind
        started = time.monotonic()
        if isinstance(action, MCPCallAction):  # the operator's server, no sandbox needed
            _, redactor = await self.secrets.for_action(command.task_id)
            observation = redactor.model(await self.mcp.run(action))
            ACTIONS.labels(kind, observation.kind).inc()
            ACTION_SECONDS.labels(kind).observe(time.monotonic() - started)
            return observation
        sandbox = await self._sandbox(command, last_try)
        if not isinstance(sandbox, Sandbox):
            return sandbox  # why there is none
        try:
            await self.checkouts.ensure(command.task_id, sandbox)
        except CheckoutFailed as exc:
            # Dead-lettered at once: the controller ends the task in ERROR with this reason.
            await self.seating.release(
                ReleaseSandbox(task_id=command.task_id, reason="no checkout")
            )
            raise PermanentError(f"the task's repository could not be checked out: {exc}") from exc
        if self.checkpoints is not None:  # the last one done; a new sandbox's files back
            await self.checkpoints.before_action(command, sandbox, self.tasks.docker)
        if not await self.ledger.start(action.id):
            ACTIONS.labels(kind, "interrupted").inc()
            return self._interrupted(action)
        try:
            secrets, redactor = await self.secrets.for_action(command.task_id)
            try:
                observation = await run_action(
                    sandbox.session, action, self.settings, self.blobs, secrets
                )
            finally:  # nothing reachable until the next action (egress_folders.py)
                egress = self.tasks.docker.egress_folders
                await egress.between_actions(sandbox.egress_token, command)
            observation = _with_notice(sandbox, observation)
            # Redacted at the source: before the ledger records it or anyone sees it.
            observation = redactor.model(observation)
        except (SandboxLost, TimeoutError) as exc:
            return await self._sandbox_failed(command, sandbox, exc)
        if self.checkpoints is not None:
            cwd = getattr(observation, "cwd", "")  # a command's: where its shell is now
            self.checkpoints.after(command, sandbox, cwd)  # taken while the agent thinks
        ACTIONS.labels(kind, observation.kind).inc()
        ACTION_SECONDS.labels(kind).observe(time.monotonic() - started)
        return observation

    async def _sandbox(
        self, command: ExecuteAction, last_try: bool
    ) -> Sandbox | RuntimeObservation:
        """The task's sandbox for the action, or the observation saying why it has none.
        Raises what is transient (the order is redelivered) unless this is its last try."""
        action = command.action
        kind = action.kind
        if command.network is not None and not self.settings.egress_folders_kept:
            ACTIONS.labels(kind, "egress_forbidden").inc()
            return error_observation(
                action,
                "This task has a network policy, but this runtime has no egress proxy "
                "(neither DECKHANDS_EGRESS_DIR nor DECKHANDS_EGRESS_ENGINE_DIR is set). "
                "The action was not run.",
                "egress_forbidden",
            )
        if command.network_egress and command.network is None:
            if not self.settings.allow_network_egress:
                ACTIONS.labels(kind, "egress_forbidden").inc()
                return error_observation(
                    action,
                    "This task asked for network access, but this runtime does not allow it "
                    "(DECKHANDS_ALLOW_NETWORK_EGRESS=false). The action was not run.",
                    "egress_forbidden",
                )
        shape = shape_for(
            self.settings,
            command.task_id,
            tenant_id=command.tenant_id,
            network_egress=command.network_egress,
            network=command.network,
            workspace_mib=command.workspace_mib,
        )
        try:
            sandbox = await self.tasks.get(command.task_id, shape)
            if shape.egress is not None:
                # While the action runs: its verdict's scope, else the task's whole policy.
                scope = command.network_scope or shape.egress.network
                during = shape.egress.model_copy(update={"network": scope})
                await self.tasks.docker.egress_folders.refresh(sandbox.egress_token, during)
            return sandbox
        except WorkspaceLost as exc:
            if self.checkpoints is not None and self.checkpoints.latest(command) is not None:
                return await self.tasks.get(command.task_id, shape)  # restored: before_action
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

    async def _sandbox_failed(
        self, command: ExecuteAction, sandbox: Sandbox, exc: SandboxLost | TimeoutError
    ) -> RuntimeObservation:
        """The sandbox died under the action, or did not answer in time."""
        action = command.action
        kind = action.kind
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
            log.error("task %s: sandbox %s stopped answering", command.task_id, sandbox.short_id)
        reason = await self.tasks.lost(command.task_id, sandbox)
        ACTIONS.labels(kind, "sandbox_lost").inc()
        seq = None if self.checkpoints is None else self.checkpoints.latest(command)
        return error_observation(
            action,
            died_during_action(reason, seq),
            "sandbox_lost",
        )

    @staticmethod
    def _interrupted(action: EventBase) -> RuntimeObservation:
        return error_observation(
            action,
            "The runtime stopped while running this action, before it could report the "
            "result; the action may or may not have taken effect. It was not run again.",
            "action_interrupted",
        )

    # -- a second copy of the order

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
                        observation = self._answer(await self.run(command, last_try=True))
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
