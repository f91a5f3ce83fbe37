"""Stand-ins for the gateway's peers, for the gateway's own tests only, and an SSE reader.

- `StorageDouble`: a core-NATS responder on the history subject that answers from a dict, in
  place of the storage service;
- `controller_inbox`: reads (and acks) what the gateway queued on the controller's work subject;
- `make_as_controller`: makes a new task's State from the gateway's creation request, as the
  controller's first turn does (only the controller writes States; no controller runs here).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from redis.asyncio import Redis

from services.gateway.settings import GatewaySettings
from services.gateway.tasks.creations import TaskCreations
from shared.commands import ForgetTaskReply, ForgetTaskRequest, HistoryReply, HistoryRequest
from shared.state import TaskState
from shared.state_store import TaskStateStore
from shared.subjects import WORK_STREAM, Service, work_subject

__all__ = [
    "EGRESS_ALLOW",
    "EGRESS_PRESETS",
    "SseFrame",
    "SseReader",
    "StorageDouble",
    "controller_inbox",
    "gateway_env",
    "make_as_controller",
    "sse_frames",
]


class StorageDouble:
    """Answers HistoryRequests from `events`, and removes a task's events on a
    ForgetTaskRequest, like the storage service would."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[HistoryRequest] = []
        self.forgotten: list[str] = []
        self.answering = True

    async def handle_forget(self, msg: Msg) -> None:
        request = ForgetTaskRequest.model_validate_json(msg.data)
        self.forgotten.append(request.task_id)
        removed = len(self.events.pop(request.task_id, []))
        reply = ForgetTaskReply(task_id=request.task_id, removed=removed)
        await msg.respond(reply.model_dump_json().encode())

    def add(self, *events: dict[str, Any]) -> None:
        for event in events:
            self.events.setdefault(event["task_id"], []).append(event)

    async def handle(self, msg: Msg) -> None:
        request = HistoryRequest.model_validate_json(msg.data)
        self.requests.append(request)
        if not self.answering:
            return
        stored = sorted(self.events.get(request.task_id, []), key=lambda e: e["seq"])
        after = [e for e in stored if e["seq"] > request.after][: request.limit]
        reply = HistoryReply(
            task_id=request.task_id,
            events=after,
            last_seq=stored[-1]["seq"] if stored else 0,
        )
        await msg.respond(reply.model_dump_json().encode())


async def make_as_controller(redis: Redis, task_id: str) -> TaskState:
    """The task's State, made (if it is not yet) from the creation request the gateway kept,
    as LOADING: what the controller's first turn starts from, for tests that then change the
    State the way the controller would."""
    [view] = await TaskCreations(redis).views([task_id])
    store = TaskStateStore(redis)
    if view is not None:
        await store.create(view)
    state = await store.load(task_id)
    assert state is not None, f"task {task_id}: no State and no creation request"
    return state


async def controller_inbox(
    nc: NatsClient, task_id: str, expect: int, *, timeout_s: float = 5.0, settle_s: float = 0.5
) -> list[dict[str, Any]]:
    """What the gateway queued for the controller about `task_id`, in order (and acked).

    Waits for `expect` messages, then `settle_s` longer so that an unexpected extra one shows.
    """
    js = nc.jetstream()
    sub = await js.pull_subscribe(work_subject(Service.CONTROLLER, task_id), stream=WORK_STREAM)
    got: list[Msg] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while True:
            now = asyncio.get_running_loop().time()
            if len(got) >= expect:
                wait = settle_s
            elif now < deadline:
                wait = deadline - now
            else:
                break
            try:
                batch = await sub.fetch(10, timeout=max(wait, 0.05))
            except (TimeoutError, nats.errors.TimeoutError):
                if len(got) >= expect:
                    break
                continue
            for msg in batch:
                await msg.ack()
            got.extend(batch)
    finally:
        # A work-queue stream allows one consumer per subject: remove this one at once.
        name = (await sub.consumer_info()).name
        await sub.unsubscribe()
        await js.delete_consumer(WORK_STREAM, name)
    return [{**json.loads(m.data), "_headers": dict(m.headers or {})} for m in got]


@dataclass
class SseFrame:
    id: str | None = None
    event: str | None = None
    data: str | None = None
    comment: str | None = None
    retry: int | None = None

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)


async def sse_frames(response: httpx.Response) -> AsyncIterator[SseFrame]:
    """Frames of a text/event-stream response as they arrive."""
    frame = SseFrame()
    async for line in response.aiter_lines():
        if line == "":
            if frame != SseFrame():
                yield frame
            frame = SseFrame()
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "":
            frame.comment = value
        elif name == "id":
            frame.id = value
        elif name == "event":
            frame.event = value
        elif name == "data":
            frame.data = value if frame.data is None else f"{frame.data}\n{value}"
        elif name == "retry":
            frame.retry = int(value)


class SseReader:
    """Reads a stream in the background, so that waiting for a frame with a timeout does not
    cancel (and so close) the stream itself."""

    def __init__(self, response: httpx.Response) -> None:
        self.frames: asyncio.Queue[SseFrame | None] = asyncio.Queue()
        self.comments: list[str] = []
        self.ended = False
        self._task = asyncio.create_task(self._read(response))

    async def _read(self, response: httpx.Response) -> None:
        try:
            async for frame in sse_frames(response):
                if frame.comment is not None:
                    self.comments.append(frame.comment)
                if frame.data is not None:
                    await self.frames.put(frame)
        finally:
            await self.frames.put(None)

    async def next_events(self, n: int, timeout_s: float = 5.0) -> list[SseFrame]:
        got: list[SseFrame] = []
        async with asyncio.timeout(timeout_s):
            while len(got) < n:
                frame = await self.frames.get()
                if frame is None:
                    self.ended = True
                    raise AssertionError(f"stream ended after {got}")
                got.append(frame)
        return got

    async def no_more_events(self, wait_s: float) -> None:
        try:
            frame = await asyncio.wait_for(self.frames.get(), wait_s)
        except TimeoutError:
            return
        if frame is None:
            self.ended = True
            return
        raise AssertionError(f"unexpected event {frame}")

    async def rest(self, timeout_s: float = 5.0) -> list[SseFrame]:
        """Every event until the server ends the stream."""
        got: list[SseFrame] = []
        async with asyncio.timeout(timeout_s):
            while (frame := await self.frames.get()) is not None:
                got.append(frame)
        self.ended = True
        return got

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, httpx.HTTPError):
            pass


# The operator's egress bound and presets in the session's gateway (test_gateway_egress.py).
EGRESS_ALLOW = ["pypi.org", "files.pythonhosted.org", "*.github.com:443", "203.0.113.0/24"]
EGRESS_PRESETS = {"python": ["pypi.org", "files.pythonhosted.org"]}


def gateway_env(settings: GatewaySettings) -> dict[str, str]:
    admin_key = settings.admin_api_key
    return {
        **os.environ,
        "DECKHANDS_ADMIN_API_KEY": "" if admin_key is None else admin_key.get_secret_value(),
        "DECKHANDS_NATS_URL": settings.nats_url,
        "DECKHANDS_REDIS_URL": settings.redis_url,
        "DECKHANDS_HOST": settings.host,
        "DECKHANDS_PORT": str(settings.port),
        "DECKHANDS_HISTORY_TIMEOUT_S": str(settings.history_timeout_s),
        "DECKHANDS_SSE_HEARTBEAT_S": str(settings.sse_heartbeat_s),
        "DECKHANDS_SSE_GAP_RETRY_S": str(settings.sse_gap_retry_s),
        "DECKHANDS_DEFAULT_MAX_ITERATIONS": "30",
        "DECKHANDS_DELETE_STOP_TIMEOUT_S": str(settings.delete_stop_timeout_s),
        "DECKHANDS_ALLOW_NETWORK_EGRESS": str(settings.allow_network_egress).lower(),
        "DECKHANDS_EGRESS_ALLOW": json.dumps(settings.egress_allow),
        "DECKHANDS_EGRESS_PRESETS": json.dumps(settings.egress_presets),
    }
