"""Publishing to JetStream with a Nats-Msg-Id, so a retried publish is stored once."""

from __future__ import annotations

from faststream.nats import NatsBroker
from pydantic import BaseModel

from .commands import ExecuteAction, ReleaseSandbox, ReviewAction, StepRequest
from .events import EventBase
from .subjects import EVENTS_STREAM, WORK_STREAM, Service, event_subject, work_subject

__all__ = ["publish_event_to", "publish_json", "publish_work"]

_JSON = {"content-type": "application/json"}


async def publish_json(
    broker: NatsBroker, subject: str, payload: str | BaseModel, msg_id: str, stream: str
) -> None:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else payload
    await broker.publish(
        data.encode(), subject, headers={**_JSON, "Nats-Msg-Id": msg_id}, stream=stream
    )


async def publish_event_to(broker: NatsBroker, service: Service, event: EventBase) -> None:
    """Send an event to a service's work queue (e.g. an observation back to the controller)."""
    await publish_json(broker, work_subject(service, event.task_id), event, event.id, WORK_STREAM)


async def publish_work(
    broker: NatsBroker,
    service: Service,
    command: StepRequest | ReviewAction | ExecuteAction | ReleaseSandbox,
) -> None:
    await publish_json(
        broker, work_subject(service, command.task_id), command, command.id, WORK_STREAM
    )


def log_subject(event: EventBase) -> tuple[str, str]:
    return event_subject(event.task_id), EVENTS_STREAM
