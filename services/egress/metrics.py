"""The egress proxy's Prometheus metrics, per tenant (never per task: unbounded labels)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

__all__ = [
    "ACTIVITY_DROPPED",
    "BODY_RELAYED",
    "BODY_SPLICED",
    "BYTES",
    "CONNECTIONS",
    "OPEN",
    "SANDBOXES",
    "SECRETS_ADDED",
]

CONNECTIONS = Counter(
    "deckhands_egress_connections_total",
    "Connections through the egress proxy, by tenant and outcome (allowed, or why refused).",
    ["tenant", "outcome"],
)
BYTES = Counter(
    "deckhands_egress_bytes_total",
    "Bytes relayed for sandboxes, by tenant and direction (out: to the internet).",
    ["tenant", "direction"],
)
OPEN = Gauge("deckhands_egress_open_connections", "Sandbox connections open now.")
SANDBOXES = Gauge("deckhands_egress_sandboxes", "Sandboxes this replica listens for.")
ACTIVITY_DROPPED = Counter(
    "deckhands_egress_activity_dropped_total",
    "Connections whose record could not be sent to their task's log (NATS away).",
)
SECRETS_ADDED = Counter(
    "deckhands_egress_secrets_added_total",
    "Requests the proxy added a tenant's bound secret to, by tenant.",
    ["tenant"],
)
BODY_RELAYED = Counter(
    "deckhands_egress_body_relayed_bytes_total",
    "Bytes of streamed plain-HTTP bodies written to sandboxes past mitmproxy's layers "
    "(body_relay.py); none after a mitmproxy upgrade that fast path does not know.",
)
BODY_SPLICED = Counter(
    "deckhands_egress_body_spliced_bytes_total",
    "Bytes of long streamed plain-HTTP bodies moved host to sandbox by splice(2), inside the "
    "kernel (body_splice.py).",
)
