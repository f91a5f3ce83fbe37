"""The storage service's event history, asked over NATS request/reply."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats.errors
from faststream.nats import NatsBroker
from pydantic import ValidationError

from shared.commands import ForgetTaskReply, ForgetTaskRequest, HistoryReply, HistoryRequest
from shared.subjects import FORGET_SUBJECT, HISTORY_SUBJECT

from ..errors import StorageBadReply, StorageUnavailable

__all__ = ["HistoryClient", "event_seq"]


def event_seq(event: dict[str, Any]) -> int | None:
    seq = event.get("seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


class HistoryClient:
    def __init__(self, broker: NatsBroker, *, timeout_s: float, page_size: int) -> None:
        self.broker = broker
        self.timeout_s = timeout_s
        self.page_size = page_size

    async def page(self, task_id: str, after: int, limit: int | None = None) -> HistoryReply:
        """Events with seq > `after`, in seq order, at most `limit` of them."""
        request = HistoryRequest(task_id=task_id, after=after, limit=limit or self.page_size)
        body = await self._ask(request.model_dump_json().encode(), HISTORY_SUBJECT, "history query")
        try:
            parsed = HistoryReply.model_validate_json(body)
        except ValidationError as exc:
            raise StorageBadReply(
                f"the storage service sent an invalid history reply: {exc.error_count()} error(s)"
            ) from exc
        if parsed.error is not None:
            raise StorageUnavailable(f"the storage service could not serve it: {parsed.error}")
        if parsed.task_id != task_id:
            raise StorageBadReply(
                f"the storage service answered for task {parsed.task_id!r}, not {task_id!r}"
            )
        # Only what was asked for, in order: a storage bug must not reorder or repeat the log.
        events = sorted(
            (e for e in parsed.events if (event_seq(e) or 0) > after),
            key=lambda e: event_seq(e) or 0,
        )
        return parsed.model_copy(update={"events": events})

    async def forget(self, task_id: str) -> int:
        """Have storage remove the task's events; how many the first replica to answer held."""
        request = ForgetTaskRequest(task_id=task_id)
        body = await self._ask(request.model_dump_json().encode(), FORGET_SUBJECT, "removal")
        try:
            parsed = ForgetTaskReply.model_validate_json(body)
        except ValidationError as exc:
            raise StorageBadReply(
                f"the storage service sent an invalid reply: {exc.error_count()} error(s)"
            ) from exc
        if parsed.error is not None:
            raise StorageUnavailable(f"the storage service could not remove it: {parsed.error}")
        return parsed.removed

    async def _ask(self, body: bytes, subject: str, what: str) -> bytes:
        try:
            reply = await self.broker.request(body, subject, timeout=self.timeout_s)
        except nats.errors.NoRespondersError as exc:
            raise StorageUnavailable(
                f"no storage service is listening for a {what}; retry later"
            ) from exc
        except (TimeoutError, nats.errors.TimeoutError) as exc:
            raise StorageUnavailable(
                f"the storage service did not answer the {what} within "
                f"{self.timeout_s:g}s; retry later"
            ) from exc
        except nats.errors.Error as exc:
            raise StorageUnavailable(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        return bytes(reply.body)

    async def all_after(self, task_id: str, after: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Every stored event after `after`, page by page."""
        while True:
            reply = await self.page(task_id, after)
            if not reply.events:
                return
            for event in reply.events:
                yield event
            after = event_seq(reply.events[-1]) or after
            if after >= reply.last_seq:
                return
            await asyncio.sleep(0)
