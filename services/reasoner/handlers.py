"""Answers a StepRequest: history from storage, prompt, LLM call, one event for the controller."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from faststream.nats import NatsBroker
from faststream.nats.annotations import NatsMessage
from nats.aio.msg import Msg

from shared.commands import StepRequest
from shared.delivery import PermanentError
from shared.publishing import publish_event_to
from shared.subjects import Service

from .history import fetch_history
from .llm import LLMCallError, LLMClient
from .metrics import STEP_ANSWERS
from .prompt import NoTaskError, build_messages
from .replies import ReasonerEvent, event_for_reply, llm_error_event
from .settings import ReasonerSettings

__all__ = ["StepHandler"]

log = logging.getLogger("deckhands.reasoner")


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


class StepHandler:
    def __init__(self, broker: NatsBroker, settings: ReasonerSettings, llm: LLMClient) -> None:
        self.broker = broker
        self.settings = settings
        self.llm = llm

    async def on_step(self, step: StepRequest, msg: NatsMessage) -> None:
        raw = _jetstream_msg(msg)
        delivered = raw.metadata.num_delivered if raw is not None else 1
        last_attempt = delivered >= self.settings.max_deliveries
        async with _still_working(msg, max(1.0, self.settings.ack_wait_s / 3)):
            event = await self.answer(step, last_attempt=last_attempt)
        await publish_event_to(self.broker, Service.CONTROLLER, event)
        STEP_ANSWERS.labels(event.kind).inc()
        log.info("task %s step %d: %s", step.task_id, step.iteration, event.kind)

    async def answer(self, step: StepRequest, *, last_attempt: bool = False) -> ReasonerEvent:
        s = self.settings
        events = await fetch_history(
            self.broker, step.task_id, step.after_seq,
            wait_s=s.history_wait_s, request_timeout_s=s.history_request_timeout_s,
            page_size=s.history_page_size,
        )
        native = self.llm.native
        try:
            messages = build_messages(
                events, native=native, max_observation_chars=s.max_observation_chars
            )
        except NoTaskError as exc:
            raise PermanentError(f"task {step.task_id}: {exc}") from exc
        try:
            reply = await self.llm.complete(messages, native=native)
        except LLMCallError as exc:
            if last_attempt:
                # Redelivering cannot help any more: let the agent (and the user) see why.
                return llm_error_event(step, str(exc))
            raise
        return event_for_reply(step, reply, native=native)
