"""Test doubles and helpers for the reasoner's integration tests: a storage service that
answers history requests from memory, and a harness that plays the controller."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
import nats
import redis
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import SecretStr

from services.reasoner.settings import ReasonerSettings
from shared.commands import HistoryReply, HistoryRequest, ReviewAction, StepRequest
from shared.events import (
    AgentState,
    AgentStateChangedObservation,
    EventAdapter,
    EventBase,
    EventSource,
    MessageAction,
)
from shared.settings import CommonSettings
from shared.state import TaskState
from shared.subjects import WORK_STREAM, Service, work_subject

__all__ = ["Harness", "StorageDouble", "reasoner_settings"]


class StorageDouble:
    """Answers HistoryRequests from an in-memory log; the test appends events with their seq."""

    def __init__(self) -> None:
        self.logs: dict[str, list[dict[str, Any]]] = {}
        self.requests = 0

    def append(self, *events: EventBase) -> list[Any]:
        stored = []
        for event in events:
            log = self.logs.setdefault(event.task_id, [])
            with_seq = event.model_copy(update={"seq": len(log) + 1})
            log.append(json.loads(with_seq.model_dump_json()))
            stored.append(with_seq)
        return stored

    def last_seq(self, task_id: str) -> int:
        return len(self.logs.get(task_id, []))

    async def on_request(self, msg: Msg) -> None:
        self.requests += 1
        request = HistoryRequest.model_validate_json(msg.data)
        log = self.logs.get(request.task_id, [])
        events = [e for e in log if e["seq"] > request.after][: request.limit]
        reply = HistoryReply(task_id=request.task_id, events=events, last_seq=len(log))
        await msg.respond(reply.model_dump_json().encode())


class Harness:
    """Publishes step requests to the reasoner and reads what it sends the controller."""

    def __init__(
        self, nc: Client, storage: StorageDouble, llm_url: str = "", redis_url: str = ""
    ) -> None:
        self.nc, self.js, self.storage = nc, nc.jetstream(), storage
        self.llm_url = llm_url
        self.redis_url = redis_url
        self._subs: dict[str, Any] = {}

    async def llm_requests(self, task: str) -> int:
        """Chat requests the scripted LLM server received for this task (its first message)."""
        async with httpx.AsyncClient() as client:
            stats = (await client.get(f"{self.llm_url}/stats", timeout=10)).json()
        return int(stats["tasks"].get(task, 0))

    def new_task(self, text: str) -> str:
        """A task as the controller starts it: the user's message, then RUNNING."""
        task_id = uuid.uuid4().hex
        if self.redis_url:  # the State the controller writes: the reasoner steps known tasks
            with redis.Redis.from_url(self.redis_url) as client:
                state = TaskState(
                    task_id=task_id, task=text, max_iterations=100, agent_state=AgentState.RUNNING
                )
                client.hset(f"deckhands:task:{task_id}", "state", state.model_dump_json())
        self.storage.append(
            MessageAction(task_id=task_id, source=EventSource.USER, content=text),
            AgentStateChangedObservation(
                task_id=task_id, source=EventSource.SYSTEM, agent_state=AgentState.RUNNING
            ),
        )
        return task_id

    async def step(
        self,
        task_id: str,
        iteration: int = 1,
        msg_id: str | None = None,
        request: StepRequest | None = None,
    ) -> StepRequest:
        step = request or StepRequest(
            task_id=task_id, after_seq=self.storage.last_seq(task_id), iteration=iteration
        )
        await self.js.publish(
            work_subject(Service.REASONER, task_id),
            step.model_dump_json().encode(),
            headers={"Nats-Msg-Id": msg_id or step.id, "content-type": "application/json"},
        )
        return step

    async def _sub(self, task_id: str) -> Any:
        """What the reasoner sends about the task: events to the controller, and runnable
        actions to the security monitor (which passes them on with its verdict)."""
        if task_id not in self._subs:
            info = await self.js.add_consumer(
                WORK_STREAM,
                ConsumerConfig(
                    filter_subjects=[
                        work_subject(Service.CONTROLLER, task_id),
                        work_subject(Service.SECURITY, task_id),
                    ],
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    inactive_threshold=300.0,
                ),
            )
            self._subs[task_id] = await self.js.pull_subscribe_bind(info.name, stream=WORK_STREAM)
        return self._subs[task_id]

    async def answer(self, task_id: str, timeout: float = 30) -> Any:
        """The next event the reasoner sent for this task (a runnable action: the one in the
        review it sent the security monitor)."""
        sub = await self._sub(task_id)
        msgs = await sub.fetch(1, timeout=timeout)
        await msgs[0].ack()
        if msgs[0].subject == work_subject(Service.SECURITY, task_id):
            return ReviewAction.model_validate_json(msgs[0].data).action
        return EventAdapter.validate_json(msgs[0].data)

    async def nothing_within(self, task_id: str, seconds: float) -> bool:
        sub = await self._sub(task_id)
        try:
            await sub.fetch(1, timeout=seconds)
        except nats.errors.TimeoutError:
            return True
        return False


def reasoner_settings(common: CommonSettings, llm_url: str, **extra: Any) -> ReasonerSettings:
    fields = common.model_dump(include=set(CommonSettings.model_fields))
    return ReasonerSettings(
        **fields,
        llm_model="openai/scripted",
        llm_api_base=llm_url,
        llm_api_key=SecretStr("test-key-not-secret"),
        llm_num_retries=0,  # failures go back to JetStream, so redelivery is what is tested
        llm_timeout_s=20,
        workers=2,
        history_wait_s=3.0,
        **extra,
    )
