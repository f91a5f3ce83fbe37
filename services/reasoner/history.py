"""A task's history, asked from the storage service over NATS request/reply."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from pydantic import ValidationError

from shared.commands import HistoryReply, HistoryRequest
from shared.events import EventAdapter
from shared.subjects import HISTORY_SUBJECT

__all__ = ["HistoryNotReady", "fetch_history"]

log = logging.getLogger("deckhands.reasoner.history")

_POLL_S = 0.1


class HistoryNotReady(Exception):
    """Storage could not give the history the step needs; the step is redelivered later."""


async def _ask(broker: NatsBroker, request: HistoryRequest, timeout_s: float) -> HistoryReply:
    response = await broker.request(request, HISTORY_SUBJECT, timeout=timeout_s)
    try:
        return HistoryReply.model_validate_json(response.body)
    except ValidationError as exc:
        # Not the caller's fault: storage answered something else (an error, a newer schema).
        raise HistoryNotReady(f"storage sent an unusable history reply: {exc}") from exc


async def fetch_history(
    broker: NatsBroker,
    task_id: str,
    up_to_seq: int,
    *,
    wait_s: float = 3.0,
    request_timeout_s: float = 2.0,
    page_size: int = 1000,
) -> list[Any]:
    """The task's events with seq <= up_to_seq, in order.

    Storage writes the log a little after the controller appends to it, so the newest events
    may be missing for a moment: ask again for up to `wait_s`, then give up with HistoryNotReady.
    """
    deadline = time.monotonic() + wait_s
    raw: list[dict[str, Any]] = []
    have = 0
    while True:
        reply = await _ask(
            broker, HistoryRequest(task_id=task_id, after=have, limit=page_size), request_timeout_s
        )
        progressed = False
        for item in reply.events:
            seq = item.get("seq")
            if isinstance(seq, int) and seq > have:
                raw.append(item)
                have, progressed = seq, True
        if progressed and have < reply.last_seq:
            continue  # another page
        if have >= up_to_seq:
            break
        if time.monotonic() >= deadline:
            raise HistoryNotReady(
                f"storage has task {task_id} up to seq {have}, the step needs seq {up_to_seq}"
            )
        await asyncio.sleep(_POLL_S)
    return _parse(task_id, [item for item in raw if item["seq"] <= up_to_seq])


def _parse(task_id: str, raw: list[dict[str, Any]]) -> list[Any]:
    events = []
    for item in raw:
        try:
            events.append(EventAdapter.validate_python(item))
        except ValidationError as exc:
            # A kind this reasoner does not know (a newer service wrote it): leave it out of
            # the prompt rather than fail the whole step.
            log.warning(
                "task %s: skipping event seq %s (%s): %s",
                task_id,
                item.get("seq"),
                item.get("kind"),
                exc.errors()[0]["msg"],
            )
    return events
