"""HTTP routes of /v1/secrets: a tenant's secrets, by name. No route returns a value. Logic
lives in SecretService."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response

from shared.secrets_store import SECRET_NAME_PATTERN

from ..context import GatewayContext, get_context
from ..http.auth import CallerDep
from ..http.models import ErrorResponse, InvalidRequestResponse
from ..secrets.models import PutSecretRequest, SecretList, SecretView
from ..secrets.service import SecretService

__all__ = ["router"]

router = APIRouter(
    prefix="/v1/secrets",
    tags=["secrets"],
    responses={
        401: {"model": ErrorResponse, "description": "No API key, or an unknown or revoked one"},
        422: {"model": InvalidRequestResponse, "description": "A bad name or value (named)"},
        403: {"model": ErrorResponse, "description": "Secrets are off on this server"},
        503: {"model": ErrorResponse, "description": "Redis unavailable; retry"},
    },
)


async def _secrets(context: Annotated[GatewayContext, Depends(get_context)]) -> SecretService:
    return SecretService(context.secrets)


SecretServiceDep = Annotated[SecretService, Depends(_secrets)]
SecretNamePath = Annotated[
    str, Path(pattern=SECRET_NAME_PATTERN, description="An environment variable name.")
]


@router.put(
    "/{name}",
    response_model=SecretView,
    responses={
        201: {"model": SecretView, "description": "Created"},
    },
    summary="Set a secret (its value is never shown again)",
)
async def put_secret(
    name: SecretNamePath,
    body: PutSecretRequest,
    caller: CallerDep,
    secrets: SecretServiceDep,
    response: Response,
) -> SecretView:
    info, created = await secrets.put(caller.tenant_id, name, body.value, body.egress)
    response.status_code = 201 if created else 200
    return SecretView.of(info)


@router.get("", response_model=SecretList, summary="The tenant's secrets: names and times")
async def list_secrets(caller: CallerDep, secrets: SecretServiceDep) -> SecretList:
    return SecretList(secrets=[SecretView.of(i) for i in await secrets.names(caller.tenant_id)])


@router.delete(
    "/{name}",
    status_code=204,
    responses={404: {"model": ErrorResponse, "description": "No secret of that name"}},
    summary="Delete a secret (tasks that name it no longer get it)",
)
async def delete_secret(name: SecretNamePath, caller: CallerDep, secrets: SecretServiceDep) -> None:
    await secrets.delete(caller.tenant_id, name)
