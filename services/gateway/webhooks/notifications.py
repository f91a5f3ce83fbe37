"""A notification: the task states notified, its event type, and how its body is signed.

A webhook names a URL and the tenant secret (shared/secrets_store.py) whose value signs its
deliveries: `Deckhands-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">`, the
scheme Stripe uses, so a receiver checks both the body and its age (docs/tenants.md: Webhooks).
"""

from __future__ import annotations

import hashlib
import hmac
import json

from shared.events import AgentState

__all__ = [
    "NOTIFIED_STATES",
    "SIGNATURE_HEADER",
    "TERMINAL",
    "WAITING_STATES",
    "body_bytes",
    "event_type",
    "sign",
]

SIGNATURE_HEADER = "Deckhands-Signature"

TERMINAL = (AgentState.FINISHED, AgentState.ERROR, AgentState.STOPPED, AgentState.REJECTED)
WAITING_STATES = frozenset({AgentState.AWAITING_USER_INPUT, AgentState.AWAITING_USER_CONFIRMATION})
NOTIFIED_STATES = frozenset({*TERMINAL, *WAITING_STATES})


def event_type(state: AgentState) -> str:
    return f"task.{state.value.lower()}"


def sign(key: bytes, body: bytes, timestamp: int) -> str:
    """The Deckhands-Signature header of `body` sent at `timestamp` (unix seconds)."""
    digest = hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={digest}"


def body_bytes(payload: dict[str, object]) -> bytes:
    """The exact bytes sent (and signed)."""
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str).encode()
