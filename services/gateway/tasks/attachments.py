"""What a task is created with besides its State: the secrets it may use and the webhook it
notifies. Checked before anything of the task is stored (an unknown secret, a refused URL: a
422 naming it), written before its first message is published (the runtime reads the grant
for its first command)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.exceptions import RedisError

from ..errors import GatewayError, StorageUnavailable
from ..secrets.service import SecretService
from ..webhooks.models import WebhookSpec
from ..webhooks.store import WebhookStore
from ..webhooks.targets import url_refused

__all__ = ["TaskAttachments", "WebhookRefused"]


class WebhookRefused(GatewayError):
    status_code = 422


class TaskAttachments:
    def __init__(
        self, secrets: SecretService, webhooks: WebhookStore, allow_private_targets: bool
    ) -> None:
        self.secrets = secrets
        self.webhooks = webhooks
        self.allow_private_targets = allow_private_targets

    async def check_webhook(self, tenant_id: str, spec: WebhookSpec) -> None:
        refused = url_refused(spec.url, self.allow_private_targets)
        if refused is not None:
            raise WebhookRefused(refused)
        await self.secrets.check_known(
            tenant_id, [spec.signing_secret], "the webhook's signing_secret names"
        )

    async def check(
        self, tenant_id: str, secret_names: Sequence[str], webhook: WebhookSpec | None
    ) -> WebhookSpec | None:
        """The webhook the task will notify (its own, else the tenant's default), once the
        secrets and the webhook are found acceptable."""
        self.secrets.check_grantable(secret_names)
        await self.secrets.check_known(tenant_id, secret_names)
        if webhook is None:
            try:
                webhook = await self.webhooks.default(tenant_id)
            except RedisError as exc:
                raise StorageUnavailable(f"webhook store (Redis) unavailable: {exc}") from exc
            if webhook is None:
                return None
        await self.check_webhook(tenant_id, webhook)
        return webhook

    async def attach(
        self,
        task_id: str,
        tenant_id: str,
        secret_names: Sequence[str],
        webhook: WebhookSpec | None,
    ) -> None:
        try:
            if secret_names:
                assert self.secrets.store is not None  # check() passed
                await self.secrets.store.grant(task_id, tenant_id, secret_names)
            if webhook is not None:
                await self.webhooks.attach(task_id, tenant_id, webhook)
        except RedisError as exc:
            raise StorageUnavailable(f"task attachments (Redis) unavailable: {exc}") from exc

    async def inherit(self, parent_id: str, fork_id: str, tenant_id: str) -> None:
        """A fork's secrets and webhook: its parent's."""
        try:
            store = self.secrets.store
            grant = None if store is None else await store.grant_of(parent_id)
            if store is not None and grant is not None and grant.names:
                await store.grant(fork_id, tenant_id, grant.names)
            webhook = await self.webhooks.of_task(parent_id)
            if webhook is not None:
                await self.webhooks.attach(fork_id, tenant_id, webhook.spec)
        except RedisError as exc:
            raise StorageUnavailable(f"task attachments (Redis) unavailable: {exc}") from exc

    async def forget(self, task_id: str) -> None:
        """A deleted task's grant, webhook and delivery log."""
        if self.secrets.store is not None:
            await self.secrets.store.forget_task(task_id)
        await self.webhooks.forget_task(task_id)
