"""Tenants' secrets behind the API: names checked, a bound on how many, values only written.
The store itself (encryption, Redis) is shared/secrets_store.py."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from redis.exceptions import RedisError

from shared.secret_egress import SecretEgress, bad_bound_value
from shared.secret_redaction import Redactor
from shared.secrets_store import (
    MAX_SECRETS_PER_TENANT,
    SecretInfo,
    SecretsStore,
    SecretUnreadable,
    bad_secret_name,
    bad_secret_value,
)

from ..errors import GatewayError, StorageUnavailable

__all__ = [
    "InvalidSecret",
    "RefusedSecretName",
    "SecretMissing",
    "SecretService",
    "SecretsOff",
    "TooManySecrets",
    "UnknownSecrets",
]


log = logging.getLogger("deckhands.gateway.secrets")


class SecretsOff(GatewayError):
    """Like a disabled egress: the server's choice, so a 403 (no retry will help)."""

    status_code = 403

    def __init__(self) -> None:
        super().__init__(
            "secrets are off on this server (its operator sets DECKHANDS_SECRETS_KEY); "
            "nothing that names a secret can be stored"
        )


class InvalidSecret(GatewayError):
    status_code = 422


class TooManySecrets(GatewayError):
    status_code = 422


class SecretMissing(GatewayError):
    status_code = 404

    def __init__(self, name: str) -> None:
        super().__init__(f"no secret named {name!r}")


class UnknownSecrets(GatewayError):
    """A task or webhook names secrets the tenant does not have."""

    status_code = 422

    def __init__(self, names: list[str], what: str = "the task names") -> None:
        listed = ", ".join(repr(n) for n in names)
        super().__init__(
            f"{what} secrets this tenant does not have: {listed} (PUT /v1/secrets/{{name}} first)"
        )
        self.extra = {"unknown_secrets": names}


class RefusedSecretName(GatewayError):
    """A task names a secret whose name may not reach its commands (stored before the name
    was reserved): it would silently not be set, so the task is refused instead."""

    status_code = 422


class SecretService:
    def __init__(self, store: SecretsStore | None) -> None:
        self.store = store

    def _store(self) -> SecretsStore:
        if self.store is None:
            raise SecretsOff()
        return self.store

    async def put(
        self, tenant_id: str, name: str, value: str, egress: SecretEgress | None = None
    ) -> tuple[SecretInfo, bool]:
        store = self._store()
        bound = bad_bound_value(value) if egress is not None else None
        for reason in (bad_secret_name(name), bad_secret_value(value), bound):
            if reason is not None:
                raise InvalidSecret(reason)
        try:
            if not await store.exists(tenant_id, name) and (
                await store.count(tenant_id) >= MAX_SECRETS_PER_TENANT
            ):
                raise TooManySecrets(
                    f"a tenant has at most {MAX_SECRETS_PER_TENANT} secrets; delete one first"
                )
            return await store.put(tenant_id, name, value, egress)
        except RedisError as exc:
            raise StorageUnavailable(f"secret store (Redis) unavailable: {exc}") from exc

    async def redactor(self, tenant_id: str, names: Iterable[str]) -> Redactor:
        """The Redactor of these secrets of the tenant (none: one that changes nothing)."""
        wanted = list(names)
        if not wanted or self.store is None:
            return Redactor({})
        try:
            return Redactor(await self.store.read_many(tenant_id, wanted))
        except RedisError as exc:
            raise StorageUnavailable(f"secret store (Redis) unavailable: {exc}") from exc
        except SecretUnreadable as exc:
            # The task would not get it either (the runtime leaves it out): nothing to hide.
            log.error("tenant %s: a secret cannot be read to redact it: %s", tenant_id, exc)
            return Redactor({})

    async def names(self, tenant_id: str) -> list[SecretInfo]:
        try:
            return await self._store().names(tenant_id)
        except RedisError as exc:
            raise StorageUnavailable(f"secret store (Redis) unavailable: {exc}") from exc

    async def delete(self, tenant_id: str, name: str) -> None:
        try:
            deleted = await self._store().delete(tenant_id, name)
        except RedisError as exc:
            raise StorageUnavailable(f"secret store (Redis) unavailable: {exc}") from exc
        if not deleted:
            raise SecretMissing(name)

    def check_grantable(self, names: Iterable[str]) -> None:
        """RefusedSecretName if a task may not be given one of `names` (checked at once: the
        store's own check is at the secret's creation)."""
        for name in names:
            why = bad_secret_name(name)
            if why is not None:
                raise RefusedSecretName(f"the task names a secret it cannot be given: {why}")

    async def check_known(
        self, tenant_id: str, names: Iterable[str], what: str = "the task names"
    ) -> None:
        """UnknownSecrets naming those of `names` the tenant has none of."""
        wanted = list(names)
        if not wanted:
            return
        try:
            missing = await self._store().missing(tenant_id, wanted)
        except RedisError as exc:
            raise StorageUnavailable(f"secret store (Redis) unavailable: {exc}") from exc
        if missing:
            raise UnknownSecrets(missing, what)
