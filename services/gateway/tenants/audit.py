"""The audit log: one line per change to tenants and keys, on the `deckhands.audit` logger.

Each line names who did it (`admin`, or the tenant's key by its prefix), what, and to what, as
`key=value` fields; never a key or a secret (a key is named by its prefix).
"""

from __future__ import annotations

import logging

__all__ = ["ADMIN", "audit"]

log = logging.getLogger("deckhands.audit")

ADMIN = "admin"


def audit(actor: str, action: str, **fields: object) -> None:
    """Log `action` by `actor` (ADMIN, or `tenant=<id> key=<prefix>`), with its fields."""
    details = " ".join(f"{name}={value!r}" for name, value in fields.items())
    log.info("audit actor=%s action=%s %s", actor, action, details)
