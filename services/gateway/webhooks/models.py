"""Request and response bodies of the webhook routes, and a webhook as a task or tenant gives it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.secrets_store import SECRET_NAME_PATTERN

__all__ = ["DeliveryAttempt", "TenantWebhookView", "WebhookLog", "WebhookSpec"]


class WebhookSpec(BaseModel):
    """A webhook as a client gives it (a task's, or the tenant's default)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        min_length=8,
        max_length=2048,
        description="http(s) URL that receives a POST on every terminal state of the task.",
    )
    signing_secret: str = Field(
        pattern=SECRET_NAME_PATTERN,
        description="Name of one of the tenant's secrets (PUT /v1/secrets/{name}): its value "
        "is the HMAC-SHA256 key of the Deckhands-Signature header.",
    )
    on_waiting: bool = Field(
        default=False,
        description="Also POST when the task waits for a person (AWAITING_USER_INPUT, "
        "AWAITING_USER_CONFIRMATION).",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("a webhook URL is http:// or https:// with a host")
        if parts.username or parts.password:
            raise ValueError("a webhook URL carries no credentials; deliveries are signed")
        return value


class DeliveryAttempt(BaseModel):
    """One POST (or one refusal to send it), as GET /v1/tasks/{id}/webhooks shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    delivery_id: str = Field(
        description="Same for every attempt of one notification; sent "
        "as Deckhands-Delivery-Id and as the body's `id` (idempotency)."
    )
    event_type: str = Field(description="e.g. task.finished, task.awaiting_user_input.")
    url: str
    attempt: int = Field(ge=1)
    at: datetime
    duration_ms: float
    status_code: int | None = Field(description="The receiver's answer; null: none came.")
    error: str = ""
    outcome: Literal["delivered", "retrying", "gave_up"]
    next_attempt_in_s: float | None = None


class TenantWebhookView(BaseModel):
    webhook: WebhookSpec | None = Field(description="The tenant's default webhook; null: none.")


class WebhookLog(BaseModel):
    task_id: str
    webhook: WebhookSpec | None = Field(description="The webhook the task notifies; null: none.")
    attempts: list[DeliveryAttempt] = Field(description="Every attempt, oldest first.")
