"""Publishing to JetStream with a Nats-Msg-Id, so a retried publish is stored once."""

from __future__ import annotations

from faststream.nats import NatsBroker
from nats.js import JetStreamContext
from opentelemetry import propagate
from pydantic import BaseModel

from .commands import ExecuteAction, ReleaseSandbox, ReviewAction, StepRequest
from .events import EventBase
from .subjects import EVENTS_STREAM, WORK_STREAM, Service, event_subject, work_subject

__all__ = [
    "HEADER_ROOM",
    "MAX_MSG_ID_BYTES",
    "MessageTooLarge",
    "check_size",
    "payload_budget",
    "publish_event_to",
    "publish_json",
    "publish_work",
]

_JSON = {"content-type": "application/json"}

# Bytes kept for the headers of a message (ours, FastStream's, a trace context): a body that
# fits the server's max_payload with these is never refused by the server (which would close
# the connection).
HEADER_ROOM = 8 * 1024
_DEFAULT_MAX_PAYLOAD = 1024 * 1024
# A message's id travels as its Nats-Msg-Id header, inside HEADER_ROOM. deckhands' ids are a
# few dozen bytes; a far longer one comes from a malformed message (ids copied from it), and
# sent as a header it would take the message past max_payload and the connection with it.
MAX_MSG_ID_BYTES = 256


class MessageTooLarge(ValueError):
    """The encoded message would pass the server's max_payload: it is not sent."""


# How long a publish waits for JetStream's acknowledgement: nats.go's default. FastStream's
# 0.5 s was too short for 200 tasks posted at once on 2 cores: stored messages were reported
# lost, and their retries added to the load.
_PUBLISH_ACK_TIMEOUT_S = 5.0


def payload_budget(broker: NatsBroker) -> int:
    """The largest body a message may have on this connection (the server's INFO)."""
    try:
        max_payload = int(broker.connection.max_payload)
    except Exception:  # not connected yet: the NATS default
        max_payload = _DEFAULT_MAX_PAYLOAD
    return max_payload - HEADER_ROOM


def check_size(broker: NatsBroker, data: bytes, what: str) -> None:
    budget = payload_budget(broker)
    if len(data) > budget:
        raise MessageTooLarge(
            f"{what} is {len(data)} bytes encoded; a message may carry at most {budget} "
            "(NATS' max_payload less room for headers)"
        )


async def publish_json(
    broker: NatsBroker, subject: str, payload: str | BaseModel, msg_id: str, stream: str
) -> None:
    data = (payload.model_dump_json() if isinstance(payload, BaseModel) else payload).encode()
    check_size(broker, data, f"the message for {subject}")
    if len(msg_id.encode()) > MAX_MSG_ID_BYTES:
        raise MessageTooLarge(
            f"the message for {subject} has an id of {len(msg_id.encode())} bytes; an id "
            f"(its Nats-Msg-Id header) may have at most {MAX_MSG_ID_BYTES}"
        )
    headers = {**_JSON, "Nats-Msg-Id": msg_id}
    # The trace context travels as FastStream's own publishing would send it.
    propagate.inject(headers)
    # Straight to nats-py's JetStream client: FastStream's publishing path (its middlewares,
    # a span and metrics per message) cost as much CPU as the publish itself, on the hottest
    # path of every service. The publishers are still declared, for the AsyncAPI document.
    jetstream: JetStreamContext = broker.config.connection_state.stream
    await jetstream.publish(
        subject, data, timeout=_PUBLISH_ACK_TIMEOUT_S, stream=stream, headers=headers
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
