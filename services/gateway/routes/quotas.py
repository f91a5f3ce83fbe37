"""HTTP route of /v1/quotas: the caller's quotas in force and what it uses of them. Logic
lives in TenantQuotas."""

from __future__ import annotations

from fastapi import APIRouter

from ..context import TenantQuotasDep
from ..http.auth import CallerDep
from ..http.models import ErrorResponse
from ..quotas.models import QuotasView
from ..quotas.service import quotas_view

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/quotas",
    tags=["quotas"],
    responses={
        401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
        503: {"model": ErrorResponse, "description": "Redis unavailable; retry"},
    },
)


@router.get("", response_model=QuotasView, summary="The caller's quotas and its use of them")
async def my_quotas(caller: CallerDep, quotas: TenantQuotasDep) -> QuotasView:
    return await quotas_view(quotas, caller.tenant_id)
