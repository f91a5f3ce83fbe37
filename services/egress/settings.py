"""Settings of the egress proxy (DECKHANDS_EGRESS_* variables; a bad value stops start-up)."""

from __future__ import annotations

import os
import socket

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["EgressSettings"]

# A unix socket's path has at most 107 bytes (sun_path); each is <dir>/sbx-<16 hex>/<replica>.sock.
_SUN_PATH = 107
_FOLDER_AND_SUFFIX = len("/sbx-0123456789abcdef/") + len(".sock")


class EgressSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DECKHANDS_EGRESS_", extra="ignore")

    dir: str = Field(
        description="The folder the runtime makes a folder in for each sandbox with a network "
        "policy (the runtime's DECKHANDS_EGRESS_DIR): its policy.json, and a socket per proxy "
        "replica, the sandbox's only way out. Required.",
    )
    replica: str = Field(
        default_factory=socket.gethostname,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="This replica's name: its socket in each sandbox's folder is <replica>.sock.",
    )
    health_host: str = Field(default="127.0.0.1", description="Where /healthz and /metrics listen.")
    health_port: int = Field(default=0, ge=0, le=65535, description="0: any free port (logged).")
    scan_interval_s: float = Field(
        default=0.1, gt=0, le=5, description="How often the folder is read for new sandboxes."
    )
    max_connections_per_task: int = Field(
        default=64, ge=1, description="Connections one task may hold open at once through it."
    )
    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="Longest wait for an upstream host's name and connection."
    )
    # Its account of each task's connections goes to the task's log through the controller
    # (activity.py); the same variables as every service's, with its own NATS user.
    nats_url: str = Field(
        default="",
        validation_alias="DECKHANDS_NATS_URL",
        description="NATS, to send each task's connections to its log; empty: logged here only.",
    )
    nats_user: str = Field(default="", validation_alias="DECKHANDS_NATS_USER")
    nats_password: SecretStr = Field(
        default=SecretStr(""), validation_alias="DECKHANDS_NATS_PASSWORD"
    )
    # Secrets bound to hosts (shared/secret_egress.py): read from the store by task, with the
    # same variables as the services' and a Redis user that reads only secrets.
    redis_url: str = Field(
        default="",
        validation_alias="DECKHANDS_REDIS_URL",
        description="Redis, to read the secrets bound to hosts; empty: no secret is added.",
    )
    redis_user: str = Field(default="", validation_alias="DECKHANDS_REDIS_USER")
    redis_password: SecretStr = Field(
        default=SecretStr(""), validation_alias="DECKHANDS_REDIS_PASSWORD"
    )
    secrets_key: SecretStr = Field(default=SecretStr(""), validation_alias="DECKHANDS_SECRETS_KEY")
    secrets_previous_keys: SecretStr = Field(
        default=SecretStr(""), validation_alias="DECKHANDS_SECRETS_PREVIOUS_KEYS"
    )
    ca_file: str = Field(
        default="",
        description="The deployment's egress CA (PEM: its private key, then its certificate), "
        "the same for every replica; sandboxes trust its certificate (the runtime's "
        "DECKHANDS_EGRESS_CA_CERT). The proxy ends TLS with it only for hosts a task's secret "
        "is bound to. Unset or an empty file: no secret is added over HTTPS (a tunnel to such "
        "a host is refused, saying so).",
    )
    upstream_ca_file: str = Field(
        default="",
        description="CA certificates (PEM) trusted for upstream hosts where the proxy ends TLS, "
        "besides the public ones (certifi): an internal API's CA.",
    )
    secrets_cache_s: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description="How long a task's bound secrets are kept before they are read again.",
    )
    activity_interval_s: float = Field(
        default=1.0, gt=0, le=60, description="How often a task's connections are sent to its log."
    )

    @model_validator(mode="after")
    def _files_exist(self) -> EgressSettings:
        for name, path in (
            ("DECKHANDS_EGRESS_CA_FILE", self.ca_file),
            ("DECKHANDS_EGRESS_UPSTREAM_CA_FILE", self.upstream_ca_file),
        ):
            if path and not os.path.isfile(path):
                raise ValueError(f"{name} names {path!r}, which is not a file")
        # An empty one is none (Kubernetes' Secret deckhands-egress-ca is shipped empty).
        if self.ca_file and os.path.getsize(self.ca_file) == 0:
            self.ca_file = ""
        if self.upstream_ca_file and os.path.getsize(self.upstream_ca_file) == 0:
            self.upstream_ca_file = ""
        return self

    @model_validator(mode="after")
    def _socket_paths_fit(self) -> EgressSettings:
        longest = len(self.dir.rstrip("/").encode()) + _FOLDER_AND_SUFFIX + len(self.replica)
        if longest > _SUN_PATH:
            raise ValueError(
                f"DECKHANDS_EGRESS_DIR {self.dir!r} with replica {self.replica!r} makes socket "
                f"paths of {longest} bytes, over the {_SUN_PATH} a unix socket may have: use a "
                "shorter folder (e.g. /var/run/deckhands-egress)"
            )
        return self
