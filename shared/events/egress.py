"""What a task's sandbox did on the network: the egress proxy's account of its connections."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .base import EventBase

__all__ = ["MAX_CONNECTIONS_PER_ENTRY", "EgressActivityObservation", "EgressConnection"]

# One log entry holds at most this many; past it a batch counts the rest (`more`).
MAX_CONNECTIONS_PER_ENTRY = 100


class EgressConnection(BaseModel):
    """One destination a connection asked for: reached (with its bytes), or refused and why."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(max_length=300, description="As the sandbox asked for it.")
    port: int = Field(ge=0, le=65535)
    allowed: bool
    reason: str = Field(
        default="",
        max_length=40,
        description="Why it was refused: not_allowed, private_address, lookup_failed, "
        "bad_host, sni_mismatch, too_many, no_egress_ca, allowance_used (the tenant's egress "
        "bytes for the day: refused, or cut mid-connection), out_of_scope (cut: the action "
        "it was opened in ended, or the policy narrowed); empty when allowed.",
    )
    secrets: tuple[str, ...] = Field(
        default=(),
        max_length=32,
        description="The names of the task's secrets the proxy added to its requests (bound "
        "to this host); never a value.",
    )
    bytes_out: int = Field(default=0, ge=0, description="Sent by the sandbox.")
    bytes_in: int = Field(default=0, ge=0, description="Received by the sandbox.")
    duration_s: float = Field(default=0.0, ge=0)
    started_at: datetime


class EgressActivityObservation(EventBase):
    """Connections of the task's sandbox through the egress proxy (issue 27), sent by the proxy
    about once a second while there are any, and logged by the controller as they come: the
    log shows what each task reached and what it was refused. Never shown to the model (it saw
    its refusals as its commands' output already)."""

    kind: Literal["egress_activity"] = "egress_activity"
    connections: list[EgressConnection] = Field(max_length=MAX_CONNECTIONS_PER_ENTRY)
    more: int = Field(
        default=0, ge=0, description="Connections in the same second beyond those listed."
    )
