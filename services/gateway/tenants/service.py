"""What the operator does to a tenant as a whole: disable it, enable it, delete it.

A disabled tenant's keys answer 403 naming why; its tasks go on (stop them, or delete the
tenant with `force`). Deleting a tenant refuses (409) while it has live tasks, unless forced:
then its tasks (and those that keep a sandbox for a resume) are asked to stop first. Its keys
are revoked and a tombstone stays, so that its id is never given again.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.events import AgentState

from ..errors import GatewayError, TaskNotFound
from ..quotas.service import TenantQuotas
from ..tasks.service import TaskService
from .audit import ADMIN, audit
from .store import Tenant, TenantStore

__all__ = ["DeletedTenant", "TenantHasLiveTasks", "TenantService"]


class TenantHasLiveTasks(GatewayError):
    status_code = 409


@dataclass(frozen=True)
class DeletedTenant:
    tenant_id: str
    keys_revoked: int
    tasks_stopped: int


class TenantService:
    def __init__(self, tenants: TenantStore, quotas: TenantQuotas, tasks: TaskService) -> None:
        self.tenants = tenants
        self.quotas = quotas
        self.tasks = tasks

    async def disable(self, tenant_id: str, reason: str) -> Tenant:
        tenant = await self.tenants.disable(tenant_id, reason)
        audit(ADMIN, "tenant.disable", tenant=tenant_id, reason=reason)
        return tenant

    async def enable(self, tenant_id: str) -> Tenant:
        tenant = await self.tenants.enable(tenant_id)
        audit(ADMIN, "tenant.enable", tenant=tenant_id)
        return tenant

    async def delete(self, tenant_id: str, *, force: bool) -> DeletedTenant:
        await self.tenants.get_tenant(tenant_id)
        live = await self.quotas.live_tasks(tenant_id)
        if live and not force:
            shown = ", ".join(live[:10]) + (", ..." if len(live) > 10 else "")
            raise TenantHasLiveTasks(
                f"tenant {tenant_id!r} has {len(live)} live tasks ({shown}): stop or delete "
                "them first, or send ?force=true to stop them with the tenant"
            )
        # Disabled first: no new task while the others stop.
        await self.tenants.disable(tenant_id, "being deleted")
        stopped = 0
        if force:
            for task_id in await self.quotas.stoppable_tasks(tenant_id):
                try:
                    await self.tasks.change_state(
                        task_id, AgentState.STOPPED, "tenant deleted", tenant_id=tenant_id
                    )
                except TaskNotFound:
                    continue  # deleted meanwhile
                stopped += 1
        revoked = await self.tenants.delete_tenant(tenant_id)
        audit(
            ADMIN,
            "tenant.delete",
            tenant=tenant_id,
            force=force,
            keys_revoked=revoked,
            tasks_stopped=stopped,
        )
        return DeletedTenant(tenant_id, revoked, stopped)
