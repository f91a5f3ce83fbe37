"""Access to a running gateway for tools, benchmarks and tests: an admin key to start it with,
and a tenant with an API key made through its admin API (`POST /v1/admin/tenants`, `.../keys`).

python -m tools.api_access --gateway URL --admin-key KEY --tenant ID   # prints a new key
"""

from __future__ import annotations

import argparse
import os
import secrets
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "auth_headers",
    "issue_key",
    "key_works",
    "new_admin_key",
    "provision_tenant",
    "read_secret",
    "write_secret",
]


def new_admin_key() -> str:
    return secrets.token_hex(32)


def auth_headers(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def provision_tenant(gateway: str, admin_key: str, tenant_id: str, *, name: str = "") -> None:
    """Create the tenant unless it exists."""
    answer = httpx.post(
        f"{gateway}/v1/admin/tenants",
        json={"id": tenant_id, "name": name},
        headers=auth_headers(admin_key),
        timeout=30,
    )
    if answer.status_code != 409:
        answer.raise_for_status()


def set_limits(gateway: str, admin_key: str, tenant_id: str, **limits: Any) -> None:
    """The operator's limits of the tenant (PUT /v1/admin/tenants/{id}/limits)."""
    answer = httpx.put(
        f"{gateway}/v1/admin/tenants/{tenant_id}/limits",
        json=limits,
        headers=auth_headers(admin_key),
        timeout=30,
    )
    answer.raise_for_status()


def issue_key(gateway: str, admin_key: str, tenant_id: str, *, name: str = "") -> str:
    """A new API key of the tenant (created first if need be)."""
    provision_tenant(gateway, admin_key, tenant_id)
    answer = httpx.post(
        f"{gateway}/v1/admin/tenants/{tenant_id}/keys",
        json={"name": name},
        headers=auth_headers(admin_key),
        timeout=30,
    )
    answer.raise_for_status()
    key: str = answer.json()["key"]
    return key


def key_works(gateway: str, key: str) -> bool:
    """Whether the gateway accepts `key` (an unknown or revoked one is a 401)."""
    answer = httpx.get(
        f"{gateway}/v1/tasks", params={"limit": 1}, headers=auth_headers(key), timeout=30
    )
    return answer.status_code != 401


def read_secret(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def write_secret(path: Path, value: str) -> None:
    """Readable by its owner only, from the moment it exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gateway", default="http://127.0.0.1:8000")
    parser.add_argument("--admin-key", default=os.environ.get("DECKHANDS_ADMIN_API_KEY"))
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--name", default="")
    args = parser.parse_args()
    if not args.admin_key:
        parser.error("--admin-key or DECKHANDS_ADMIN_API_KEY is needed")
    print(issue_key(args.gateway, args.admin_key, args.tenant, name=args.name))


if __name__ == "__main__":
    main()
