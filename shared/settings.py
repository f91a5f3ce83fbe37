"""Settings every service shares. Each service extends `CommonSettings` with its own."""

from __future__ import annotations

import base64
import binascii

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .mcp_config import McpServerConfig

__all__ = ["CommonSettings"]


def _urlsafe_b64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text.encode() + b"=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return b""


def _check_url(value: str) -> None:
    if "://" not in value:
        raise ValueError(f"{value!r} is not a URL (expected scheme://host:port)")


class CommonSettings(BaseSettings):
    """Read from DECKHANDS_* environment variables; a bad value stops start-up with its name."""

    model_config = SettingsConfigDict(env_prefix="DECKHANDS_", extra="ignore", frozen=True)

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        description="The NATS server, or a cluster's servers separated by commas (a client "
        "connects to any of them and moves to another when it goes down).",
    )
    redis_url: str = "redis://127.0.0.1:6379/0"
    redis_max_connections: int = Field(
        default=256,
        ge=1,
        description="Connections to Redis this process opens at most; a command waits for a "
        "free one (up to 10 s) rather than failing when all are busy.",
    )
    # Credentials (Kubernetes: from the Secrets deckhands-nats-users / deckhands-redis-users;
    # `make up`: from .run/credentials). Empty: connect without (an unlocked server).
    nats_user: str = Field(default="", description="This service's NATS user.")
    nats_password: SecretStr = Field(
        default=SecretStr(""), description="The NATS user's password (never logged)."
    )
    redis_user: str = Field(default="", description="This service's Redis ACL user.")
    redis_password: SecretStr = Field(
        default=SecretStr(""), description="The Redis ACL user's password (never logged)."
    )
    metrics_port: int = Field(
        default=0, ge=0, le=65535, description="/metrics, /healthz and /readyz; 0: none."
    )
    health_stall_s: float = Field(
        default=120.0,
        gt=0,
        description="/readyz fails for a consumer with messages waiting that received or "
        "finished none in this process for this long.",
    )
    health_reconnect_grace_s: float = Field(
        default=300.0,
        gt=0,
        description="/healthz fails once the NATS connection has been down this long.",
    )
    health_deadline_s: float = Field(
        default=1.5, gt=0, description="How long the event loop may take to answer a probe."
    )
    log_level: str = "INFO"
    pool_name: str = Field(
        default="default",
        pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$",
        description="The sandbox pool: label value (deckhands.pool) that scopes which containers "
        "the runtime owns, and the name of its seats and queue in Redis; replicas sharing a "
        "Docker engine and Redis use the same name.",
    )

    max_deliveries: int = Field(
        default=5, ge=1, description="Deliveries of one message before it is dead-lettered."
    )
    retry_backoff_s: float = Field(default=0.5, gt=0, description="First redelivery delay.")
    retry_backoff_max_s: float = Field(default=10.0, gt=0)
    ack_wait_s: float = Field(
        default=60.0, gt=0, description="A silent consumer's message is redelivered after this."
    )
    shutdown_timeout_s: float = Field(
        default=25.0,
        gt=0,
        description="A service whose shutdown has not finished after this exits anyway (a "
        "broker or store gone meanwhile must not keep it running).",
    )
    stream_max_age_days: float = Field(default=30.0, gt=0)
    stream_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="Copies of each stream (and the blob store) in a JetStream cluster: 3 "
        "survives the loss of one server; at most the number of servers.",
    )
    blob_store_max_bytes: int = Field(
        default=8 << 30,
        ge=1 << 20,
        description="Size of the object store that keeps large content (whole outputs) events "
        "refer to; when full, new content is not kept and the event says so.",
    )
    checkpoint_store_max_bytes: int = Field(
        default=8 << 30,
        ge=1 << 20,
        description="Size of the object store that keeps tasks' workspace checkpoints (issue "
        "28); when full, a checkpoint is not taken and the task's log says so.",
    )

    secrets_key: SecretStr = Field(
        default=SecretStr(""),
        description="Encrypts tenants' secrets at rest (shared/secrets_store.py): 32 random "
        "bytes, URL-safe base64. Kubernetes: the Secret deckhands-secrets-key; `make up`: "
        ".run/credentials/secrets-key. Empty: secrets are off (the routes answer 503).",
    )
    secrets_previous_keys: SecretStr = Field(
        default=SecretStr(""),
        description="Older secrets keys, comma-separated: they still open what they sealed "
        "while DECKHANDS_SECRETS_KEY seals anew (key rotation).",
    )

    mcp_servers: list[McpServerConfig] = Field(
        default_factory=list,
        description="The operator's MCP servers, a JSON list of {name, command | url, env?, cwd?, "
        "timeout_s?}: their tools are offered to the agent as mcp__<name>__<tool> (the "
        "reasoner lists them at start-up, the runtime calls them). Empty: none.",
    )

    otel_exporter: str = Field(
        default="none", description="'none', 'console' or 'otlp' (OTLP over HTTP)."
    )
    otel_endpoint: str = "http://127.0.0.1:4318/v1/traces"

    @field_validator("nats_url")
    @classmethod
    def _are_urls(cls, value: str) -> str:
        for url in value.split(","):
            _check_url(url.strip())
        return value

    @field_validator("redis_url")
    @classmethod
    def _is_url(cls, value: str) -> str:
        _check_url(value)
        return value

    @field_validator("secrets_key", "secrets_previous_keys")
    @classmethod
    def _are_keys(cls, value: SecretStr, info: ValidationInfo) -> SecretStr:
        for key in value.get_secret_value().split(","):
            if key.strip() and len(_urlsafe_b64(key.strip())) != 32:
                name = f"DECKHANDS_{(info.field_name or '').upper()}"
                raise ValueError(
                    f"{name} must be 32 random bytes in URL-safe base64 (44 characters), e.g. "
                    "python -c 'import base64,os; print(base64.urlsafe_b64encode(os.urandom(32))"
                    ".decode())'"
                )
        return value

    @model_validator(mode="after")
    def _passwords_have_users(self) -> CommonSettings:
        for system in ("nats", "redis"):
            password: SecretStr = getattr(self, f"{system}_password")
            if password.get_secret_value() and not getattr(self, f"{system}_user"):
                name = f"DECKHANDS_{system.upper()}"
                raise ValueError(f"{name}_PASSWORD is set without {name}_USER")
        return self

    @property
    def nats_servers(self) -> list[str]:
        """The servers of nats_url, as nats-py takes them."""
        return [url.strip() for url in self.nats_url.split(",") if url.strip()]

    @field_validator("otel_exporter")
    @classmethod
    def _known_exporter(cls, value: str) -> str:
        if value not in {"none", "console", "otlp"}:
            raise ValueError(f"unknown exporter {value!r}; use none, console or otlp")
        return value
