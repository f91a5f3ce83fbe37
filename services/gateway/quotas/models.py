"""Response bodies of a tenant's quotas (/v1/quotas, /v1/admin/tenants/{id}/limits)."""

from __future__ import annotations

from pydantic import Field

from ..http.models import ApiView
from .limits import Quotas, TenantLimits

__all__ = ["QuotaUsage", "QuotasView"]


class QuotaUsage(ApiView):
    running_tasks: int
    sandboxes: int
    spend_usd_today: float = Field(
        description="Today's (UTC) spend: what ended tasks spent, and the budgets running tasks "
        "reserved."
    )
    egress_bytes_today: int = Field(
        default=0,
        description="Bytes the tenant's sandboxes moved through the egress proxy today (UTC), "
        "both ways, as the proxies counted them (about a second behind).",
    )


class QuotasView(ApiView):
    """A tenant's quotas in force and what it uses of them."""

    tenant_id: str
    limits: Quotas = Field(description="In force: the tenant's own, else the server's defaults.")
    own: TenantLimits = Field(description="What the operator set for this tenant (null: default).")
    usage: QuotaUsage
