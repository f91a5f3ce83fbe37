"""Request and response bodies of /v1/secrets."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from shared.secrets_store import MAX_SECRET_BYTES, SecretInfo

__all__ = ["PutSecretRequest", "SecretList", "SecretView"]


class PutSecretRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: str = Field(
        min_length=1,
        max_length=MAX_SECRET_BYTES,
        description="The secret's value (at least 4 characters); never returned by any route.",
    )


class SecretView(BaseModel):
    name: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, info: SecretInfo) -> SecretView:
        return cls(name=info.name, created_at=info.created_at, updated_at=info.updated_at)


class SecretList(BaseModel):
    secrets: list[SecretView]
