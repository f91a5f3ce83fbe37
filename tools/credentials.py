"""The local stack's NATS and Redis credentials: one password per user, made once, kept in
`.run/credentials/` (each file 0600), and the server configuration files made from them.

Nothing is baked in: a fresh `.run/` gets new random passwords; a second `make up` reuses them.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from shared.broker_permissions import (
    NATS_USERS,
    REDIS_USERS,
    inbox_prefix,
    nats_authorization,
    redis_acl,
)

from .api_access import read_secret, write_secret

__all__ = ["Credentials", "ensure_credentials"]


@dataclass(frozen=True)
class Credentials:
    directory: Path
    nats: dict[str, str]
    redis: dict[str, str]

    @property
    def nats_auth_file(self) -> Path:
        """nats-server configuration: the authorization block (passed with -c)."""
        return self.directory / "nats-auth.conf"

    @property
    def redis_acl_file(self) -> Path:
        return self.directory / "redis-users.acl"

    def service_env(self, service: str) -> dict[str, str]:
        """DECKHANDS_* variables that log `service` in to NATS (and Redis, if it uses it)."""
        env = {"DECKHANDS_NATS_USER": service, "DECKHANDS_NATS_PASSWORD": self.nats[service]}
        if service in self.redis:
            env |= {
                "DECKHANDS_REDIS_USER": service,
                "DECKHANDS_REDIS_PASSWORD": self.redis[service],
            }
        return env

    def nats_login(self, user: str) -> dict[str, str]:
        """nats.connect keyword arguments for `user`."""
        return {"user": user, "password": self.nats[user], "inbox_prefix": inbox_prefix(user)}


def _password(directory: Path, name: str) -> str:
    path = directory / name
    kept = read_secret(path)
    if kept:
        return kept
    made = secrets.token_urlsafe(24)
    write_secret(path, made)
    return made


def ensure_credentials(directory: Path) -> Credentials:
    """The passwords kept in `directory` (new ones for users that have none), and the NATS and
    Redis configuration files written from them."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    credentials = Credentials(
        directory,
        {user: _password(directory, f"nats-{user}") for user in NATS_USERS},
        {user: _password(directory, f"redis-{user}") for user in REDIS_USERS},
    )
    write_secret(
        credentials.nats_auth_file,
        nats_authorization(lambda user: json.dumps(credentials.nats[user])),
    )
    write_secret(
        credentials.redis_acl_file,
        "\n".join(redis_acl(lambda user: credentials.redis[user])),
    )
    return credentials
