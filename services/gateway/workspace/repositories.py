"""The repository a task starts from (POST /v1/tasks `repository`): checked up front, a 422
naming the problem, and recorded (Redis, shared/workspace.py) before the task's first message;
the runtime reads it when it gives the task its first sandbox (services/runtime/checkout.py)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from shared.address_policy import allowed_host_names, url_host_refused
from shared.secrets_store import SecretsStore
from shared.workspace import RepositoryRecords, RepositorySpec, bad_ref, bad_repository_url

from ..errors import GatewayError

__all__ = ["RepositoryCheck", "RepositoryRefused"]


class RepositoryRefused(GatewayError):
    status_code = 422


def host_refused(url: str, allowed_hosts: frozenset[str]) -> str | None:
    """Why the URL's host is refused as written (a literal address the policy refuses,
    however written, or this machine's name); a name is resolved and checked by the runtime
    when it fetches (services/runtime/checkout.py)."""
    why = url_host_refused(url, allowed_hosts)
    if why is None:
        return None
    return (
        f"host refused by the address policy: {why} (the operator may allow named hosts "
        "with DECKHANDS_REPOSITORY_ALLOWED_HOSTS)"
    )


class RepositoryCheck:
    """`repository` of POST /v1/tasks: checked up front (a 422 naming the problem), recorded
    before the task's first message (the runtime reads it when it gives the task a sandbox)."""

    def __init__(
        self,
        redis: Redis,
        schemes: list[str],
        secrets: SecretsStore | None,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.records = RepositoryRecords(redis)
        self.schemes = schemes
        self.secrets = secrets
        self.allowed_hosts = allowed_host_names(allowed_hosts)

    async def check(self, tenant_id: str, raw: dict[str, Any]) -> RepositorySpec:
        try:
            spec = RepositorySpec.model_validate(raw)
        except ValidationError as exc:  # the request model checked it already
            raise RepositoryRefused(f"repository: {exc.errors()[0]['msg']}") from None
        why = bad_repository_url(spec.url, self.schemes)
        if why is None:
            why = host_refused(spec.url, self.allowed_hosts)
        if why is None and spec.ref is not None:
            why = bad_ref(spec.ref)
        if why is not None:
            raise RepositoryRefused(f"repository: {why}")
        if spec.token_secret is not None:
            if self.secrets is None:
                raise RepositoryRefused(
                    "repository.token_secret: secrets are off on this server "
                    "(DECKHANDS_SECRETS_KEY unset)"
                )
            if not await self.secrets.exists(tenant_id, spec.token_secret):
                raise RepositoryRefused(
                    f"repository.token_secret: the tenant has no secret {spec.token_secret!r} "
                    "(PUT /v1/secrets/{name})"
                )
        return spec

    async def record(self, task_id: str, tenant_id: str, spec: RepositorySpec) -> None:
        await self.records.put(task_id, spec, tenant_id)

    async def forget(self, task_id: str) -> None:
        """A deleted task's repository, the gateway's record. What its checkout recorded is
        the runtime's: it removes that when the deletions stream tells it."""
        await self.records.forget_repository(task_id)
