"""Who is calling: `Authorization: Bearer <key>` on every route but the probes and /metrics.

A tenant's API key (services.gateway.tenants.api_keys) makes the caller that tenant; the admin key
(DECKHANDS_ADMIN_API_KEY) opens /v1/admin and nothing else, and a tenant's key never opens it.
Every failure is the same 401, whatever was wrong (no key, a malformed, unknown or revoked one).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..context import GatewayContext, get_context
from ..errors import Unauthorized
from ..tenants.api_keys import same_secret
from ..tenants.store import Caller

__all__ = [
    "AdminDep",
    "AnyKeyDep",
    "CallerDep",
    "authenticate_admin",
    "authenticate_any",
    "authenticate_caller",
]

# auto_error=False: a missing header is our 401 (with WWW-Authenticate), not FastAPI's 403.
_tenant_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="ApiKey",
    description="A tenant's API key (`dh_...`), issued by POST /v1/admin/tenants/{id}/keys.",
)
_admin_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="AdminKey",
    description="The admin key (DECKHANDS_ADMIN_API_KEY).",
)

_NO_KEY = "missing, malformed, unknown or revoked API key: send 'Authorization: Bearer <key>'"


async def authenticate_caller(
    context: Annotated[GatewayContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_tenant_bearer)],
) -> Caller:
    if credentials is None:
        raise Unauthorized(_NO_KEY)
    caller = await context.tenants.authenticate(credentials.credentials)
    if caller is None:
        raise Unauthorized(_NO_KEY)
    return caller


async def authenticate_admin(
    context: Annotated[GatewayContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_admin_bearer)],
) -> None:
    expected = context.settings.admin_api_key
    if expected is None:
        raise Unauthorized("the admin API is off: DECKHANDS_ADMIN_API_KEY is not set")
    if credentials is None or not same_secret(credentials.credentials, expected.get_secret_value()):
        raise Unauthorized("missing or wrong admin key: send 'Authorization: Bearer <admin key>'")


async def authenticate_any(
    context: Annotated[GatewayContext, Depends(get_context)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_tenant_bearer)],
) -> None:
    """A tenant's key or the admin key: for what any caller may read (the API's document)."""
    if credentials is None:
        raise Unauthorized(_NO_KEY)
    expected = context.settings.admin_api_key
    if expected is not None and same_secret(credentials.credentials, expected.get_secret_value()):
        return
    if await context.tenants.authenticate(credentials.credentials) is None:
        raise Unauthorized(_NO_KEY)


CallerDep = Annotated[Caller, Depends(authenticate_caller)]
AdminDep = Depends(authenticate_admin)
AnyKeyDep = Depends(authenticate_any)
