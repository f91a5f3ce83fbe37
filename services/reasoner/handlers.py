"""Answers a StepRequest: history from storage, prompt, LLM call, one event for the controller.

In order: a task with a stored trajectory gets its next recorded action (no LLM call); a prompt
over budget gets a CondensationAction; otherwise the LLM decides. While the LLM call waits out a
rate limit, the controller gets a RATE_LIMITED notice (a ChangeAgentStateAction) per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from faststream.nats import NatsBroker
from nats.aio.msg import Msg
from redis.asyncio import Redis

from shared.blobs import BlobMissing, BlobStore
from shared.broker import handled_message
from shared.commands import ReviewAction, StepRequest
from shared.delivery import PermanentError
from shared.events import RUNNABLE_ACTION_TYPES
from shared.forks import in_course
from shared.publishing import publish_event_to, publish_work
from shared.state_store import TaskStateStore
from shared.subjects import Service
from shared.trajectory import TrajectoryError, load_trajectory
from shared.workspace import RepositoryRecords

from .condenser import Condensation, TokenCounter, plan_condensation, summary_lines
from .errors import ContextWindowExceeded, HistoryNotReady, LLMCallError, NoTaskError
from .finish_review import finish_review
from .history import HistoryCache
from .instructions import RepoInstructions, noting
from .llm import LLMClient, RateLimitNotice
from .metrics import REASONER_CONDENSATIONS, REASONER_REPLAYED, STEP_ANSWERS, STEP_PHASE
from .prompt import PromptView, prompt_view
from .replay import recorded_actions, replay_index, replayed_action
from .replies import (
    ReasonerEvent,
    bounded_event,
    condensation_event,
    first_look_event,
    keep_large_write,
    llm_error_event,
    planned_event,
    rate_limited_event,
    reply_event,
    step_event_id,
)
from .seat_wait import SeatWait
from .settings import ReasonerSettings
from .tools import TOOL_SPECS

__all__ = ["StepHandler"]

log = logging.getLogger("deckhands.reasoner")

# Tasks one replica remembers to have no trajectory to replay (the recent ones are stepping).
_TASKS_WITHOUT_TRAJECTORY_KEPT = 100_000


def _jetstream_msg(message: Any) -> Msg | None:
    raw = getattr(message, "raw_message", None)
    if isinstance(raw, Msg) and (raw.reply or "").startswith("$JS.ACK"):
        return raw
    return None


@contextlib.asynccontextmanager
async def _still_working(message: Any, every_s: float) -> AsyncIterator[None]:
    """Tell JetStream the step is in progress while a slow LLM thinks, so it is not redelivered
    to another replica after ack_wait."""
    raw = _jetstream_msg(message)
    if raw is None:
        yield
        return

    async def beat() -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await raw.in_progress()
            except Exception as exc:  # the connection may be reconnecting; the next beat retries
                log.debug("in-progress signal failed: %s", exc)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _surely_within(view: PromptView, native: bool, budget: int) -> bool:
    """True when the prompt cannot reach `budget` tokens: a token is at least one character,
    and ASCII-escaped JSON spends 6 on a character that may take several tokens."""
    size = len(json.dumps(view.messages())) + (len(json.dumps(TOOL_SPECS)) if native else 0)
    return size <= budget


class StepHandler:
    def __init__(
        self,
        broker: NatsBroker,
        settings: ReasonerSettings,
        llm: LLMClient,
        redis: Redis | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.llm = llm
        self.redis = redis  # set at start-up; None: no trajectories to replay
        self.seats: SeatWait | None = None  # set at start-up with Redis
        self.blobs = blobs  # for file writes too large for an event (None: refused)
        self.tokens = TokenCounter(settings.llm_model)
        self._without_trajectory: OrderedDict[str, None] = OrderedDict()
        self.history = HistoryCache(
            broker,
            max_bytes=settings.history_cache_bytes,
            page_size=settings.history_page_size,
            page_bytes=settings.history_page_bytes,
            request_timeout_s=settings.history_request_timeout_s,
            wait_s=settings.history_wait_s,
        )

    async def _carry_content(
        self, trajectory: list[dict[str, Any]], events: list[Any], replayed: Any
    ) -> None:
        """A replayed write whose content the recorded task kept in the blob store gets a
        copy under this task. A trajectory from elsewhere has none to copy: the runtime then
        answers that the content is missing."""
        ref = getattr(replayed, "content_ref", None)
        if ref is None or self.blobs is None:
            return
        source = recorded_actions(trajectory)[replay_index(events)].task_id
        if source == replayed.task_id:
            return
        try:
            data = await self.blobs.get(source, ref.sha256)
        except BlobMissing:
            log.info(
                "task %s: replayed write's content %s is not kept", replayed.task_id, ref.sha256
            )
            return
        await self.blobs.put(replayed.task_id, data)

    async def on_step(self, step: StepRequest) -> None:
        msg = handled_message(self.broker)
        raw = _jetstream_msg(msg)
        delivered = raw.metadata.num_delivered if raw is not None else 1
        last_attempt = delivered >= self.settings.max_deliveries
        async with _still_working(msg, max(1.0, self.settings.ack_wait_s / 3)):
            event = await self.answer(
                step, last_attempt=last_attempt, on_rate_limit=self._rate_limit_notice(step)
            )
        answered = time.perf_counter()
        if isinstance(event, RUNNABLE_ACTION_TYPES) and step.review_runnable:
            # Where the controller's step request said: by way of the security monitor, which
            # sends it on with its verdict, so the controller logs both and orders the run in
            # one turn.
            await publish_work(
                self.broker,
                Service.SECURITY,
                # One review per action: a publish retried after a lost ack is stored once.
                ReviewAction(id=f"review-{event.id}", task_id=event.task_id, action=event),
            )
        else:
            await publish_event_to(self.broker, Service.CONTROLLER, event)
        STEP_PHASE.labels("publish").observe(time.perf_counter() - answered)
        STEP_ANSWERS.labels(event.kind).inc()
        log.info("task %s step %d: %s", step.task_id, step.iteration, event.kind)

    def _rate_limit_notice(self, step: StepRequest) -> RateLimitNotice:
        async def notify(attempt: int, wait_s: float, why: str) -> None:
            try:
                await publish_event_to(
                    self.broker,
                    Service.CONTROLLER,
                    rate_limited_event(step, attempt, wait_s, why),
                )
            except Exception as exc:  # a notice is for show: never fail the step over it
                log.warning("task %s: RATE_LIMITED notice not sent: %s", step.task_id, exc)

        return notify

    async def _trajectory(self, task_id: str) -> list[dict[str, Any]] | None:
        if self.redis is None:
            return None
        if task_id in self._without_trajectory:
            # Saved before the task's first step or never: a task without one is asked once.
            self._without_trajectory.move_to_end(task_id)
            return None
        try:
            trajectory = await load_trajectory(self.redis, task_id)
        except TrajectoryError as exc:
            # Only a hand-written key can be corrupt (the gateway checks what it saves): the
            # task goes on with the LLM rather than hang.
            log.error("task %s: unusable trajectory, using the LLM: %s", task_id, exc)
            trajectory = None
        if trajectory is None:
            self._without_trajectory[task_id] = None
            if len(self._without_trajectory) > _TASKS_WITHOUT_TRAJECTORY_KEPT:
                self._without_trajectory.popitem(last=False)
        return trajectory

    async def answer(
        self,
        step: StepRequest,
        *,
        last_attempt: bool = False,
        on_rate_limit: RateLimitNotice | None = None,
    ) -> ReasonerEvent:
        s = self.settings
        began = time.perf_counter()
        trajectory = await self._trajectory(step.task_id)
        try:
            events = await self.history.fetch(step.task_id, step.after_seq, step.events)
        except HistoryNotReady:
            if self.redis is not None and not await TaskStateStore(self.redis).exists(step.task_id):
                # Not a storage delay: no such task. Dead-lettered on this first delivery.
                raise PermanentError(f"task {step.task_id} is unknown: nothing to step") from None
            raise
        STEP_PHASE.labels("history").observe(time.perf_counter() - began)
        # A rewound task's history leaves out what its rewinds took out of its course.
        events = in_course(events)
        if trajectory is not None:
            replayed = replayed_action(step, trajectory, events)
            if replayed is not None:
                await self._carry_content(trajectory, events, replayed)
                REASONER_REPLAYED.inc()
                return replayed  # type: ignore[no-any-return]
        first_look = first_look_event(step, events, s.agent_first_look)
        if first_look is not None:
            return first_look
        planned = planned_event(step, events) if s.agent_planned_calls else None
        if planned is not None:
            return planned
        native = self.llm.native
        instructions = await self._instructions(step.task_id)
        try:
            view = prompt_view(
                events,
                native=native,
                max_observation_chars=s.max_observation_chars,
                instructions=instructions,
            )
        except NoTaskError as exc:
            raise PermanentError(f"task {step.task_id}: {exc}") from exc
        condensed = await self._condense(step, view, events, native, force=False)
        if condensed is not None:
            return condensed
        if step.iteration <= 1 and self.seats is not None:
            await self.seats.until_seated(step.task_id)
        asked = time.perf_counter()
        try:
            reply = await self.llm.complete(
                view.messages(),
                native=native,
                on_rate_limit=on_rate_limit,
                tenant_id=step.tenant_id,
                priority=step.priority,
            )
        except ContextWindowExceeded as exc:
            condensed = await self._condense(step, view, events, native, force=True)
            if condensed is not None:
                return condensed
            # Redelivering cannot shrink the prompt: tell the agent (and the user) now.
            return llm_error_event(step, f"{exc} (and the history cannot be condensed any further)")
        except LLMCallError as exc:
            if last_attempt:
                # Redelivering cannot help any more: let the agent (and the user) see why.
                return llm_error_event(step, str(exc))
            raise
        STEP_PHASE.labels("llm").observe(time.perf_counter() - asked)
        event = reply_event(step, reply, native=native, planned_limit=s.agent_planned_calls)
        if s.agent_review_finish:
            event = finish_review(step, event, events, step_event_id(step)) or event
        if self.blobs is not None:
            event = await keep_large_write(
                event, self.blobs.put, s.max_action_bytes, s.max_write_bytes
            )
        bounded = bounded_event(step, event, reply.usage, s.max_action_bytes)
        return noting(bounded, instructions, events)  # type: ignore[no-any-return]

    def attach(self, redis: Redis) -> None:
        """Redis, once reached at start-up: trajectories to replay, and the seats a queued
        task's first step waits for."""
        self.redis = redis
        s = self.settings
        self.seats = SeatWait(
            redis, s.pool_name, max_held=max(1, s.workers // 2), max_wait_s=s.first_step_seat_wait_s
        )

    async def detach(self) -> None:
        if self.seats is not None:
            await self.seats.close()
            self.seats = None
        if self.redis is not None:
            await self.redis.aclose()
            self.redis = None

    async def _instructions(self, task_id: str) -> RepoInstructions | None:
        """The workspace's repository instructions (AGENTS.md), kept by the runtime."""
        if self.redis is None:
            return None
        try:
            found = await RepositoryRecords(self.redis).instructions(task_id)
        except Exception as exc:  # a step without them beats no step
            log.warning("task %s: repository instructions not read: %s", task_id, exc)
            return None
        return None if found is None else RepoInstructions.of(*found)

    async def _condense(
        self, step: StepRequest, view: PromptView, events: list[Any], native: bool, *, force: bool
    ) -> ReasonerEvent | None:
        s = self.settings
        if not force and s.llm_max_input_tokens <= 0:
            return None
        if not force and _surely_within(view, native, s.llm_max_input_tokens):
            return None  # spares tokenizing the whole prompt on every short step

        def plan_it() -> Condensation | None:  # tokenizing is CPU work: off the event loop
            return plan_condensation(
                view,
                summary_lines(events, view.task_seq),
                count=self.tokens,
                native=native,
                budget=s.llm_max_input_tokens,
                target_fraction=s.condenser_target_fraction,
                keep_recent=s.condenser_keep_recent,
                max_summary_chars=s.condenser_max_summary_chars,
                force=force,
            )

        plan = await asyncio.to_thread(plan_it)
        if plan is None:
            return None
        trigger = "context_window" if force else "budget"
        REASONER_CONDENSATIONS.labels(trigger).inc()
        log.info(
            "task %s: condensing up to seq %d (%s): about %d -> %d prompt tokens",
            step.task_id,
            plan.forgotten_up_to_seq,
            trigger,
            plan.tokens_before,
            plan.tokens_after,
        )
        return condensation_event(step, plan.forgotten_up_to_seq, plan.summary)
