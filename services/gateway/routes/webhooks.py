"""HTTP routes of webhooks: a task's delivery log, and the tenant's default webhook. Logic
lives in webhooks/ (store, checks) and tasks/attachments.py."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from redis.exceptions import RedisError

from ..context import GatewayContext, TaskServiceDep, get_context
from ..errors import StorageUnavailable
from ..http.auth import CallerDep
from ..http.models import ErrorResponse, InvalidRequestResponse
from ..tasks.attachments import TaskAttachments
from ..webhooks.models import TenantWebhookView, WebhookLog, WebhookSpec

__all__ = ["router"]

_RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {"model": InvalidRequestResponse, "description": "An invalid field, a refused URL"},
    403: {"model": ErrorResponse, "description": "Secrets (to sign with) are off here"},
    503: {"model": ErrorResponse, "description": "Redis unavailable; retry"},
    401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
}
router = APIRouter(tags=["webhooks"], responses=_RESPONSES)


async def _attachments(
    context: Annotated[GatewayContext, Depends(get_context)],
) -> TaskAttachments:
    assert context.attachments is not None, "built with the context"
    return context.attachments


AttachmentsDep = Annotated[TaskAttachments, Depends(_attachments)]


@router.get(
    "/v1/tasks/{task_id}/webhooks",
    response_model=WebhookLog,
    responses={404: {"model": ErrorResponse, "description": "No such task (of this tenant)"}},
    summary="The task's webhook and every delivery attempt (times, status codes, errors)",
)
async def task_webhooks(
    task_id: str, caller: CallerDep, tasks: TaskServiceDep, attachments: AttachmentsDep
) -> WebhookLog:
    await tasks.get_owned(task_id, caller.tenant_id)
    try:
        webhook = await attachments.webhooks.of_task(task_id)
        attempts = await attachments.webhooks.attempts(task_id)
    except RedisError as exc:
        raise StorageUnavailable(f"webhook store (Redis) unavailable: {exc}") from exc
    return WebhookLog(
        task_id=task_id, webhook=None if webhook is None else webhook.spec, attempts=attempts
    )


@router.get(
    "/v1/webhook",
    response_model=TenantWebhookView,
    summary="The tenant's default webhook (for tasks created without one)",
)
async def get_default_webhook(caller: CallerDep, attachments: AttachmentsDep) -> TenantWebhookView:
    try:
        return TenantWebhookView(webhook=await attachments.webhooks.default(caller.tenant_id))
    except RedisError as exc:
        raise StorageUnavailable(f"webhook store (Redis) unavailable: {exc}") from exc


@router.put(
    "/v1/webhook",
    response_model=TenantWebhookView,
    summary="Set the tenant's default webhook (tasks created from now on)",
)
async def put_default_webhook(
    body: WebhookSpec, caller: CallerDep, attachments: AttachmentsDep
) -> TenantWebhookView:
    await attachments.check_webhook(caller.tenant_id, body)
    try:
        await attachments.webhooks.set_default(caller.tenant_id, body)
    except RedisError as exc:
        raise StorageUnavailable(f"webhook store (Redis) unavailable: {exc}") from exc
    return TenantWebhookView(webhook=body)


@router.delete("/v1/webhook", status_code=204, summary="Remove the tenant's default webhook")
async def delete_default_webhook(caller: CallerDep, attachments: AttachmentsDep) -> None:
    try:
        await attachments.webhooks.clear_default(caller.tenant_id)
    except RedisError as exc:
        raise StorageUnavailable(f"webhook store (Redis) unavailable: {exc}") from exc
