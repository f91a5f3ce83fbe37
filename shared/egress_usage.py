"""A tenant's egress bytes per UTC day (issue 27, item 5): where they are counted, and the
allowance they are held to.

- `deckhands:egress-allowances` (HASH tenant -> bytes a UTC day): written by the gateway from
  the operator's limits (services/gateway/quotas/egress_allowance.py), read by the egress proxy;
  a tenant not there has no limit.
- `deckhands:egress-bytes:<tenant>:<UTC day>`: the bytes the tenant's sandboxes moved through
  the proxy that day, both ways, added by each proxy replica about once a second
  (services/egress/usage.py) and kept two days; the gateway reads it at admission (a 429 once
  it reaches the allowance) and for `GET /v1/quotas`.
"""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["ALLOWANCES_KEY", "BYTES_KEPT_S", "egress_bytes_key", "utc_day"]

ALLOWANCES_KEY = "deckhands:egress-allowances"
BYTES_KEPT_S = 2 * 86400


def utc_day(at: datetime) -> str:
    """The UTC day a quota counts `at` in (the spend per day's too)."""
    return at.astimezone(UTC).strftime("%Y-%m-%d")


def egress_bytes_key(tenant_id: str, day: str) -> str:
    return f"deckhands:egress-bytes:{tenant_id}:{day}"
