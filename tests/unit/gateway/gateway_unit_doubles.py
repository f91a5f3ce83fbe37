"""The storage service's side of the history request/reply, for the gateway's unit tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg

from shared.commands import HistoryRequest

__all__ = ["Responder", "StorageStandIn"]

Responder = Callable[[HistoryRequest], Awaitable[bytes | None]]


class StorageStandIn:
    """Storage's side of the request/reply, answering as `answer` says."""

    def __init__(self) -> None:
        self.seen: list[HistoryRequest] = []
        self.answer: Responder | None = None

    async def handle(self, msg: Msg) -> None:
        request = HistoryRequest.model_validate_json(msg.data)
        self.seen.append(request)
        assert self.answer is not None
        body = await self.answer(request)
        if body is not None:
            await msg.respond(body)
