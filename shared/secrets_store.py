"""Tenants' secrets: kept in Redis encrypted with AES-256-GCM, and the one place that reads them.

A secret is a name and a value. Its value is written by the gateway (`PUT /v1/secrets/{name}`)
and read back only by the services that hand it to a task: the runtime, which puts a task's
secrets into its commands' environment, and the controller, which redacts them from the log.
No route of the API returns a value.

The key (`DECKHANDS_SECRETS_KEY`: 32 random bytes, URL-safe base64; on Kubernetes from the
Secret `deckhands-secrets-key`, with `make up` made once into `.run/credentials/secrets-key`)
never reaches Redis: a copy of Redis (its dump, its AOF, a replica) holds only ciphertexts, each
bound to its tenant and name (shared/secrets_cipher.py). Every record names the key it was sealed
with: a key is rotated by giving the new one as `DECKHANDS_SECRETS_KEY` and the old ones in
`DECKHANDS_SECRETS_PREVIOUS_KEYS` (comma-separated) until every secret was written again.

What a secret may be named and hold, and how many there may be: shared/secret_names.py.

Redis keys (the `deckhands:` namespace):
- `deckhands:secrets:<tenant>`: hash, name -> the sealed record (JSON);
- `deckhands:task-secrets:<task>`: the secrets a task was created with (its tenant and their
  names: never the values), written by the gateway when it creates the task.

Redis is what every reader reads. The writer (the gateway) also keeps each record in a durable
store first (`durable`: the NATS key-value bucket SECRETS_BUCKET, as `secret.<tenant>.<name>`
and `grant.<task>`), from which a Redis that lost its data is filled again
(services/gateway/secrets/records.py).

For other modules, the read side is:

    store = SecretsStore.from_settings(redis, settings)   # None: no key configured
    value = await store.read(tenant_id, "GITHUB_TOKEN")    # SecretNotFound if there is none
    values = await store.values_for_task(task_id)          # {name: value} the task may use
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from .events import utc_now
from .secret_egress import SecretEgress

# Re-exported: the rules of names and values, and the cipher, are imported from here too.
from .secret_names import (
    MAX_SECRET_BYTES,
    MAX_SECRETS_PER_TASK,
    MAX_SECRETS_PER_TENANT,
    MIN_SECRET_CHARS,
    SECRET_NAME_PATTERN,
    bad_secret_name,
    bad_secret_value,
)
from .secrets_cipher import SecretsCipher, SecretUnreadable, new_secrets_key
from .settings import CommonSettings

__all__ = [
    "MAX_SECRETS_PER_TASK",
    "MAX_SECRETS_PER_TENANT",
    "MAX_SECRET_BYTES",
    "MIN_SECRET_CHARS",
    "SECRET_NAME_PATTERN",
    "SecretInfo",
    "SecretNotFound",
    "SecretUnreadable",
    "SecretsCipher",
    "SecretsDurable",
    "SecretsStore",
    "StoredSecret",
    "TaskSecretGrant",
    "bad_secret_name",
    "bad_secret_value",
    "new_secrets_key",
]

_PREFIX = "deckhands"


class SecretNotFound(LookupError):
    def __init__(self, tenant_id: str, name: str) -> None:
        super().__init__(f"tenant {tenant_id!r} has no secret {name!r}")
        self.tenant_id = tenant_id
        self.name = name


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    sealed: str
    created_at: datetime
    updated_at: datetime
    # Hosts the egress proxy adds it for; sealed with the value (`_context`).
    egress: SecretEgress | None = None


def _context(egress: SecretEgress | None) -> str:
    return egress.model_dump_json() if egress is not None else ""


class SecretInfo(BaseModel):
    """What may be shown of a secret: never its value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    created_at: datetime
    updated_at: datetime
    egress: SecretEgress | None = None


@dataclass(frozen=True)
class StoredSecret:
    """A secret as a reader gets it: its value, and the hosts it is bound to (None: it goes
    into the task's commands' environment instead)."""

    name: str
    value: str = field(repr=False)
    egress: SecretEgress | None = None


class TaskSecretGrant(BaseModel):
    """The secrets a task may use: its tenant's, by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    names: tuple[str, ...]


class SecretsDurable(Protocol):
    """Where the writer keeps every record too (key `secret.<tenant>.<name>` or `grant.<task>`,
    the same JSON as in Redis): what a Redis that lost its data is filled from."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...


@dataclass
class SecretsStore:
    redis: Redis
    cipher: SecretsCipher
    prefix: str = _PREFIX
    durable: SecretsDurable | None = None  # the gateway's; readers have none

    @classmethod
    def from_settings(cls, redis: Redis, settings: CommonSettings) -> SecretsStore | None:
        """The store, or None when no DECKHANDS_SECRETS_KEY is configured (secrets are off).
        A malformed key raises ValueError naming the setting."""
        key = settings.secrets_key.get_secret_value()
        if not key:
            return None
        return cls(
            redis,
            SecretsCipher.from_text(key, settings.secrets_previous_keys.get_secret_value()),
        )

    def _tenant_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:secrets:{tenant_id}"

    def _grant_key(self, task_id: str) -> str:
        return f"{self.prefix}:task-secrets:{task_id}"

    # -- the tenant's own (the gateway)

    async def put(
        self, tenant_id: str, name: str, value: str, egress: SecretEgress | None = None
    ) -> tuple[SecretInfo, bool]:
        """Set a secret, bound to hosts or not; (what may be shown of it, whether it is new)."""
        key = self._tenant_key(tenant_id)
        now = utc_now()
        raw = await self.redis.hget(key, name)
        created_at = now if raw is None else _Record.model_validate_json(raw).created_at
        key_id, sealed = self.cipher.seal(tenant_id, name, value, _context(egress))
        record = _Record(
            key_id=key_id, sealed=sealed, created_at=created_at, updated_at=now, egress=egress
        )
        raw_record = record.model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"secret.{tenant_id}.{name}", raw_record.encode())
        await self.redis.hset(key, name, raw_record)
        info = SecretInfo(name=name, created_at=created_at, updated_at=now, egress=egress)
        return info, raw is None

    async def count(self, tenant_id: str) -> int:
        return int(await self.redis.hlen(self._tenant_key(tenant_id)))

    async def exists(self, tenant_id: str, name: str) -> bool:
        return bool(await self.redis.hexists(self._tenant_key(tenant_id), name))

    async def names(self, tenant_id: str) -> list[SecretInfo]:
        """The tenant's secrets by name, without their values."""
        raw = await self.redis.hgetall(self._tenant_key(tenant_id))
        infos = []
        for name, value in raw.items():
            record = _Record.model_validate_json(value)
            infos.append(
                SecretInfo(
                    name=_text(name),
                    created_at=record.created_at,
                    updated_at=record.updated_at,
                    egress=record.egress,
                )
            )
        return sorted(infos, key=lambda info: info.name)

    async def delete(self, tenant_id: str, name: str) -> bool:
        if self.durable is not None:
            await self.durable.delete(f"secret.{tenant_id}.{name}")
        return bool(await self.redis.hdel(self._tenant_key(tenant_id), name))

    async def missing(self, tenant_id: str, names: Iterable[str]) -> list[str]:
        """Those of `names` the tenant has no secret of."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return []
        found = await self.redis.hmget(self._tenant_key(tenant_id), wanted)
        return [name for name, raw in zip(wanted, found, strict=True) if raw is None]

    # -- reading values (the runtime, the controller, a checkout)

    async def read(self, tenant_id: str, name: str) -> str:
        """A secret's value; SecretNotFound if the tenant has none of that name."""
        raw = await self.redis.hget(self._tenant_key(tenant_id), name)
        if raw is None:
            raise SecretNotFound(tenant_id, name)
        return self._open(tenant_id, name, _Record.model_validate_json(raw)).value

    def _open(self, tenant_id: str, name: str, record: _Record) -> StoredSecret:
        value = self.cipher.open(
            tenant_id, name, record.key_id, record.sealed, _context(record.egress)
        )
        return StoredSecret(name, value, record.egress)

    async def read_stored(self, tenant_id: str, names: Iterable[str]) -> list[StoredSecret]:
        """Those of `names` the tenant has (a deleted one is left out), with their bindings."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return []
        found = await self.redis.hmget(self._tenant_key(tenant_id), wanted)
        return [
            self._open(tenant_id, name, _Record.model_validate_json(raw))
            for name, raw in zip(wanted, found, strict=True)
            if raw is not None
        ]

    async def read_many(self, tenant_id: str, names: Iterable[str]) -> dict[str, str]:
        """The values of those of `names` the tenant has (a deleted one is left out), bound
        to hosts or not: what is redacted wherever it shows."""
        return {s.name: s.value for s in await self.read_stored(tenant_id, names)}

    # -- which secrets a task may use

    async def grant(self, task_id: str, tenant_id: str, names: Iterable[str]) -> None:
        """Let the task use these secrets of its tenant (set when the task is created)."""
        grant = TaskSecretGrant(tenant_id=tenant_id, names=tuple(dict.fromkeys(names)))
        raw = grant.model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"grant.{task_id}", raw.encode())
        await self.redis.set(self._grant_key(task_id), raw)

    async def grant_of(self, task_id: str) -> TaskSecretGrant | None:
        raw = await self.redis.get(self._grant_key(task_id))
        return None if raw is None else TaskSecretGrant.model_validate_json(raw)

    async def values_for_task(self, task_id: str) -> dict[str, str]:
        """{name: value} of the secrets the task may use and its tenant still has."""
        grant = await self.grant_of(task_id)
        if grant is None or not grant.names:
            return {}
        return await self.read_many(grant.tenant_id, grant.names)

    async def stored_for_task(self, task_id: str) -> list[StoredSecret]:
        """The secrets the task may use and its tenant still has, with their bindings."""
        grant = await self.grant_of(task_id)
        if grant is None or not grant.names:
            return []
        return await self.read_stored(grant.tenant_id, grant.names)

    async def forget_task(self, task_id: str) -> None:
        if self.durable is not None:
            await self.durable.delete(f"grant.{task_id}")
        await self.redis.delete(self._grant_key(task_id))

    # -- filling a Redis that lost its data (the gateway, from `durable`)

    async def restore(self, key: str, value: bytes) -> bool:
        """Put back one durable record unless Redis has one (a newer write wins); whether it
        was missing."""
        kind, _, rest = key.partition(".")
        if kind == "secret":
            tenant_id, _, name = rest.partition(".")
            return bool(await self.redis.hsetnx(self._tenant_key(tenant_id), name, value))
        if kind == "grant":
            return bool(await self.redis.set(self._grant_key(rest), value, nx=True))
        return False


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
