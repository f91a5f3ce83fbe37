"""Load State, apply one event, save with compare-and-set, then publish what was decided."""

from __future__ import annotations

import asyncio
import logging
import time

from faststream.nats import NatsBroker
from nats.errors import Error as NatsError

from shared.commands import ForgetTaskRequest
from shared.delivery import PermanentError
from shared.events import (
    AnswerMissingObservation,
    Event,
    EventBase,
    EventSource,
    RewindAction,
    TaskCreatedObservation,
    utc_now,
)
from shared.periodic import every
from shared.publishing import publish_event_to, publish_json
from shared.state import Awaiting, Outgoing, TaskState
from shared.state_store import StateConflict, TaskStateStore
from shared.subjects import EVENTS_STREAM, Service
from shared.task_creation import first_message, requested, state_from_created

from .agent_loop import apply, ask_for_lost_step, created_entry, rewind, send_queued_action
from .agent_loop.next_hop import fail
from .deadlines import AnswerDeadlines
from .errors import RebuildError, TaskNotMadeYet
from .fork import fork_turn
from .metrics import CONFLICTS, OVERDUE, REBUILT, REPLAYED, TURN_SECONDS, count_task_end
from .published_inputs import PublishedInputs
from .rebuild import rebuild_at, rebuild_state, waits_for_a_seat
from .secret_filter import SecretFilter
from .state_cache import StateCache
from .stuck import LoopPolicy
from .task_log import TaskLog, has_ended
from .turn import Turn

__all__ = ["ControllerHandlers"]

log = logging.getLogger("deckhands.controller")

# A task whose last entry is younger than this may be in the middle of a turn.
_SETTLE_S = 1.0
# How many times one recovery round waits for such tasks before leaving them to the next round.
_SETTLE_ROUNDS = 3
# An overdue notice not yet applied (the controller busy or down) is looked at again after this.
_OVERDUE_RECHECK_S = 30.0


def _request_to_make(event: EventBase) -> TaskCreatedObservation | None:
    """The gateway's request to make a task (its creation entry, with the task's text)."""
    if isinstance(event, TaskCreatedObservation) and event.task is not None:
        return event
    return None


class ControllerHandlers:
    def __init__(
        self,
        broker: NatsBroker,
        store: TaskStateStore,
        cas_attempts: int,
        deadlines: AnswerDeadlines | None = None,
        answer_retries: int = 2,
        cache: StateCache | None = None,
        task_log: TaskLog | None = None,
        secrets: SecretFilter | None = None,
        loop: LoopPolicy | None = None,
    ) -> None:
        self.broker = broker
        self.store = store
        self.cas_attempts = cas_attempts
        self.deadlines = deadlines or AnswerDeadlines(900.0, 120.0, 900.0)
        self.answer_retries = answer_retries
        self.cache = cache if cache is not None else StateCache(0)
        self.task_log = task_log
        self.secrets = secrets or SecretFilter(None)
        self.loop = loop or LoopPolicy()
        self._published = PublishedInputs()

    async def on_input(self, event: Event) -> None:
        event = await self.secrets.redact(event)
        with TURN_SECONDS.time():
            outbox = await self._decide(event)
        await self._publish(outbox)
        self._published.seen(event.id)

    async def _publish(self, outbox: list[Outgoing]) -> None:
        """Send a turn's messages: the log entries first, then the orders, each group in order
        on each subject (a task's log stays in seq order), the subjects side by side, so a turn
        waits for one JetStream acknowledgement per message on its longest subject of each
        group. A message lost midway is sent again with the rest when the input is redelivered
        (`has_processed`), and its Nats-Msg-Id makes a second copy a no-op.

        Orders wait for the log: an order sent while its log entry was refused (the events
        stream electing a leader while the work stream is fine) is answered, and the answer's
        turn logs the next seq behind a gap that the redelivery may no longer fill (its outbox
        is only kept for a few turns)."""
        logged = [m for m in outbox if m.stream == EVENTS_STREAM and not m.carried]
        carried = [m for m in outbox if m.carried]  # older entries: beside the turn's own
        await asyncio.gather(
            self._publish_side_by_side(logged), self._publish_side_by_side(carried)
        )
        await self._publish_side_by_side([m for m in outbox if m.stream != EVENTS_STREAM])

    async def _publish_side_by_side(self, messages: list[Outgoing]) -> None:
        chains: dict[str, list[Outgoing]] = {}
        for message in messages:
            chains.setdefault(message.subject, []).append(message)

        async def send(chain: list[Outgoing]) -> None:
            for m in chain:
                await publish_json(self.broker, m.subject, m.payload, m.msg_id, m.stream)

        if len(chains) == 1:
            await send(messages)
            return
        await asyncio.gather(*(send(chain) for chain in chains.values()))

    async def _decide(self, event: Event) -> list[Outgoing]:
        for _ in range(self.cas_attempts):
            cached = self.cache.get(event.task_id)
            state = await (
                self.store.fresh(cached) if cached is not None else self.store.load(event.task_id)
            )
            making = _request_to_make(event) if state is None else None
            if making is not None and not await self.store.intact():
                # Redis lost its data: the request may be for a task that has run since (its
                # copy redelivered); its log, not the request, says where it stands.
                state = await self._recover(event.task_id, event)
                making = None if state is not None else making
            if making is not None:
                state = state_from_created(making)
            elif state is None:
                state = await self._recover(event.task_id, event) or await self._unmade(event)
            if state.has_processed(event.id):
                # Applied before, but maybe not fully published: publish it again (the
                # Nats-Msg-Id of each message makes a second copy a no-op in JetStream).
                REPLAYED.inc()
                return state.outboxes.get(event.id, [])
            if making is not None and making.forked_from is not None:
                turn = await self._fork(making)
            elif isinstance(event, RewindAction):
                turn = await self._rewind(state, event)
            else:
                turn = Turn(state, answer_retries=self.answer_retries, loop=self.loop)
                # A new task's first turn takes its text as the first user message.
                apply(turn, event if making is None else first_message(making))
            turn.update(**self.deadlines.rearm(state, turn.state, event, utc_now()))
            for sub_task in turn.new_tasks:
                # Before the parent's save: a sub-task must exist before its first input.
                await self.store.create(sub_task)
            outbox = turn.outbox() + turn.state.outbox_leaving(self._published)
            turn.update(updated_at=utc_now(), **turn.state.record_input(event.id, outbox))
            try:
                saved = await self._save(turn.state, new=making is not None)
            except StateConflict:
                CONFLICTS.inc()
                self.cache.drop(event.task_id)  # someone else wrote: read theirs next
                continue
            self.cache.put(saved)
            count_task_end(state, turn.state)
            return outbox
        raise RuntimeError(
            f"task {event.task_id}: state kept changing under {self.cas_attempts} tries"
        )

    async def _fork(self, making: TaskCreatedObservation) -> Turn:
        """A fork's first turn (fork.py) from its parent's log; one the log cannot give (the
        parent deleted since the gateway checked it) makes the fork end in ERROR saying so."""
        parent = making.forked_from or ""
        try:
            if self.task_log is None:
                raise RebuildError("this controller reads no task logs")
            return fork_turn(making, await self.task_log.read_shared(parent), self.answer_retries)
        except (RebuildError, NatsError, TimeoutError) as exc:
            log.warning("task %s: fork of %s failed: %s", making.task_id, parent, exc)
            turn = Turn(
                state_from_created(making), answer_retries=self.answer_retries, loop=self.loop
            )
            turn.log(created_entry(turn.state))
            fail(turn, f"could not fork task {parent} at seq {making.forked_at}: {exc}"[:1000])
            return turn

    async def _rewind(self, state: TaskState, event: RewindAction) -> Turn:
        """A rewind's turn (agent_loop/rewind.py), its point rebuilt from the task's log."""
        turn = Turn(state, answer_retries=self.answer_retries, loop=self.loop)
        try:
            if self.task_log is None:
                raise RebuildError("this controller reads no task logs")
            point = rebuild_at(await self.task_log.read(state.task_id), event.to)
        except (RebuildError, NatsError, TimeoutError) as exc:
            log.warning("task %s: rewind to seq %d failed: %s", state.task_id, event.to, exc)
            rewind(turn, event, None, f"its log could not be read ({exc})"[:300])
            return turn
        rewind(turn, event, point)
        return turn

    async def on_deletion(self, request: ForgetTaskRequest) -> None:
        """A deleted task (DELETE /v1/tasks/{id}, from the deletions stream): its State and
        deadline go. The gateway waited for the task to stop and removed its record first, so
        nobody sees the task meanwhile, and no turn of it runs any more."""
        await self.store.delete(request.task_id)
        self.cache.drop(request.task_id)
        log.info("task %s deleted: State removed", request.task_id)

    async def _save(self, state: TaskState, *, new: bool) -> TaskState:
        """The turn's State saved by compare-and-set; a new task's made if nobody made it
        first (StateConflict: another replica took its creation request)."""
        if not new:
            return await self.store.save(state)
        if not await self.store.create(state):
            raise StateConflict(state.task_id)
        return state.model_copy(update={"version": 1})

    async def _unmade(self, event: EventBase) -> TaskState:
        """An input for a task with no State and no log. The gateway may have accepted the task
        a moment ago and sent the request to make it (a message sent right after the task was
        created, taken side by side with the request): wait for it. Otherwise nothing will
        ever make the task."""
        if event.source is EventSource.USER and await requested(self.store.redis, event.task_id):
            raise TaskNotMadeYet(event.task_id)
        raise PermanentError(f"unknown task {event.task_id}")

    async def _recover(
        self, task_id: str, event: EventBase | None, *, quiet: bool = False
    ) -> TaskState | None:
        """The task's State rebuilt from its log and created in Redis, when Redis lost it; None
        when the task has no log (it never ran a turn: nothing says what it was) or the log
        cannot rebuild it. `event` is the input that found the State missing, if any."""
        if self.task_log is None:
            return None
        try:
            entries = await self.task_log.read(task_id)
            if not entries:
                return None
            rebuilt = rebuild_state(entries, event)
        except RebuildError as exc:
            log.error("task %s: its State is lost and cannot be rebuilt: %s", task_id, exc)
            return None
        turn = Turn(rebuilt, answer_retries=self.answer_retries, loop=self.loop)
        if rebuilt.awaiting is Awaiting.AGENT and rebuilt.awaiting_id is None:
            ask_for_lost_step(turn)
        elif waits_for_a_seat(entries, rebuilt):
            send_queued_action(turn)
        elif rebuilt.awaiting is Awaiting.RUNTIME and rebuilt.pending_action is not None:
            # On its way to the runtime: if it answers "queued", Redis may have lost that queue.
            turn.update(requeue_if_queued=True)
        turn.update(awaiting_deadline=self.deadlines.deadline(turn.state, utc_now()))
        outbox = turn.outbox()
        turn.update(**turn.state.record_input(f"rebuilt-{task_id}-{rebuilt.last_seq}", outbox))
        # Versions start again above any the lost Redis held: a replica's cached State from
        # before the loss then fails its compare-and-set instead of passing it by chance.
        version = int(time.time() * 1000)
        if not await self.store.create(turn.state, version):
            return await self.store.load(task_id)  # another replica rebuilt it first
        REBUILT.inc()
        log.log(
            logging.INFO if quiet else logging.WARNING,
            "task %s: State rebuilt from its log (%d entries): %s, awaiting %s",
            task_id,
            len(entries),
            rebuilt.agent_state.value,
            turn.state.awaiting.value,
        )
        await self._publish(outbox)
        saved = turn.state.model_copy(update={"version": version})
        self.cache.put(saved)
        return saved

    async def recover_lost_states(self) -> int:
        """Rebuild the State of every task still going when Redis lost them (a FLUSHALL, a new
        Redis): its marker key is gone. Tasks that were waiting for an answer get it, but one
        waiting for a person or for a seat (the runtime's queue was in Redis too) would hear
        nothing: rebuilt here, the gateway shows it and the runtime runs its actions again.
        Live tasks come first, those caught mid-turn again once they settle; ended tasks after
        every live one (nobody waits for them, but their owners look them up and list them);
        the marker is set once all are back."""
        task_log = self.task_log
        if task_log is None or await self.store.intact():
            return 0
        # Before the first read: a loss during the pass then keeps the marker from being set.
        token = await self.store.marker.begin_pass()
        ended: list[str] = []
        settling: list[str] = []
        recovered = 0
        for task_id in await task_log.task_ids():
            outcome = await self._recover_if_settled(task_log, task_id)
            if outcome == "ended":
                ended.append(task_id)
            elif outcome == "settling":
                settling.append(task_id)
            recovered += outcome == "rebuilt"
        for _ in range(_SETTLE_ROUNDS):
            if not settling:
                break
            # A task queued for a seat hears nothing until it is rebuilt: not after the ended.
            await asyncio.sleep(_SETTLE_S)
            still: list[str] = []
            for task_id in settling:
                outcome = await self._recover_if_settled(task_log, task_id)
                if outcome == "settling":
                    still.append(task_id)
                recovered += outcome == "rebuilt"
            settling = still
        restored = 0
        for task_id in ended:
            # An input may have rebuilt it meanwhile; create() below keeps the first anyway.
            if not await self.store.exists(task_id) and (
                await self._recover(task_id, None, quiet=True) is not None
            ):
                restored += 1
        if not settling:
            await self.store.marker.end_pass(token)
        if recovered or restored:
            log.warning(
                "Redis had lost its States: rebuilt %d live and %d ended tasks from the log",
                recovered,
                restored,
            )
        return recovered

    async def _recover_if_settled(self, task_log: TaskLog, task_id: str) -> str:
        """One live task's State rebuilt if Redis lost it: "rebuilt", "ended" (left for
        later), "settling" (a turn may still be publishing what it logged: a rebuild from part
        of it would log the same seqs again), or "kept" (nothing to do)."""
        if await self.store.exists(task_id):
            return "kept"
        last = await task_log.last_entry(task_id)
        if last is None:
            return "kept"
        if has_ended(last):
            return "ended"
        if (utc_now() - last.timestamp).total_seconds() < _SETTLE_S:
            return "settling"
        return "rebuilt" if await self._recover(task_id, None) is not None else "kept"

    async def watch_lost_states(self, every_s: float) -> None:
        """The recovery loop, for the life of the process."""
        await every(every_s, self.recover_lost_states, "looking for States Redis lost", log)

    async def sweep_overdue(self) -> int:
        """Tell each task whose awaited answer is overdue; any replica may do it, and the
        notice's id (the awaited id and attempt) makes a second replica's copy a no-op."""
        now = time.time()
        sent = 0
        for task_id, deadline in await self.store.overdue(now):
            state = await self.store.load(task_id)
            due = state.awaiting_deadline if state is not None else None
            if state is None or due is None or state.awaiting_id is None:
                continue  # ended meanwhile: its next save clears the entry
            if due.timestamp() > now:
                continue
            notice = AnswerMissingObservation(
                id=f"overdue-{state.awaiting_id}-{state.awaiting_attempt}",
                task_id=task_id,
                source=EventSource.SYSTEM,
                cause=state.awaiting_id,
                why="overdue",
                awaiting=state.awaiting.value,
                attempt=state.awaiting_attempt,
                detail=f"no answer by {due.isoformat()} (request {state.awaiting_attempt + 1})",
            )
            await publish_event_to(self.broker, Service.CONTROLLER, notice)
            await self.store.postpone(task_id, deadline, now + _OVERDUE_RECHECK_S)
            OVERDUE.inc()
            sent += 1
        return sent

    async def watch_deadlines(self, every_s: float) -> None:
        """The sweeper loop, for the life of the process."""
        await every(every_s, self.sweep_overdue, "looking for overdue answers", log)
