"""The fields every event carries, whatever its kind."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["BlobRef", "EventBase", "EventSource", "new_id", "utc_now"]


def new_id() -> str:
    return uuid.uuid4().hex


def utc_now() -> datetime:
    return datetime.now(UTC)


class EventSource(StrEnum):
    USER = "USER"
    AGENT = "AGENT"
    ENVIRONMENT = "ENVIRONMENT"
    SYSTEM = "SYSTEM"


class EventBase(BaseModel):
    """Frozen and strict: an event is a fact, and a typo in a field name is a bug, not data."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(default_factory=new_id, description="Unique id; also the Nats-Msg-Id.")
    task_id: str
    seq: int | None = Field(
        default=None,
        description="Position in the task's log, assigned by the controller when it appends.",
    )
    timestamp: datetime = Field(default_factory=utc_now)
    source: EventSource
    cause: str | None = Field(
        default=None, description="Id of the event this one answers (an observation's action)."
    )
    inherited_from: str | None = Field(
        default=None,
        description="In a fork's log (issue 28): the task that logged this entry first; the "
        "fork's copy keeps its seq and time, under an id of its own.",
    )


class BlobRef(BaseModel):
    """A claim check: content too large to travel in an event, kept in JetStream's object store
    under `<task id>/<sha256>`; `GET /v1/tasks/{id}/blobs/{sha256}` serves it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Hex SHA-256 of the content.")
    size: int = Field(ge=0, description="Bytes.")
    media_type: str = Field(default="text/plain; charset=utf-8")
