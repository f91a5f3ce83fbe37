"""Request and response bodies of /v1/secrets."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.secret_egress import SecretEgress
from shared.secrets_store import MAX_SECRET_BYTES, SecretInfo

__all__ = ["PutSecretRequest", "SecretList", "SecretView"]


class PutSecretRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(
        min_length=1,
        max_length=MAX_SECRET_BYTES,
        description="The secret's value (at least 4 characters); never returned by any route.",
    )
    egress: SecretEgress | None = Field(
        default=None,
        description="Hosts the egress proxy adds it for, as a header, instead of putting it "
        "into the task's commands' environment: the sandbox never holds it. Changed only by "
        "writing the value again.",
    )


class SecretView(BaseModel):
    name: str
    created_at: datetime
    updated_at: datetime
    egress: SecretEgress | None = None

    @classmethod
    def of(cls, info: SecretInfo) -> SecretView:
        return cls(
            name=info.name,
            created_at=info.created_at,
            updated_at=info.updated_at,
            egress=info.egress,
        )


class SecretList(BaseModel):
    secrets: list[SecretView]
