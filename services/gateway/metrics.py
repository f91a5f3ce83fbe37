"""The gateway's Prometheus metrics (served on its own /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "CREATIONS_IN_FLIGHT",
    "CREATIONS_REFUSED",
    "DELIVERIES",
    "HTTP_LATENCY",
    "HTTP_REQUESTS",
    "OPEN_STREAMS",
    "QUOTA_REFUSALS",
    "REFUSED_REQUESTS",
    "TASKS_CREATED",
    "USER_EVENTS",
]

# --- task creation (tasks/creation_slots.py, tasks/service.py) --------------------------------

CREATIONS_IN_FLIGHT = Gauge(
    "deckhands_gateway_creations_in_flight", "Task creations this gateway is handling now"
)
CREATIONS_REFUSED = Counter(
    "deckhands_gateway_creations_refused_total",
    "Task creations answered 503 because max_creations_in_flight were being handled",
)
TASKS_CREATED = Counter("deckhands_gateway_tasks_created_total", "Tasks created by the gateway")
QUOTA_REFUSALS = Counter(
    "deckhands_gateway_quota_refusals_total", "Requests refused (429) at a tenant's quota"
)
USER_EVENTS = Counter(
    "deckhands_gateway_user_events_total", "User events queued for the controller", ["kind"]
)

# --- event streams (events/stream.py) ---------------------------------------------------------

OPEN_STREAMS = Gauge("deckhands_gateway_event_streams_open", "Event streams (SSE) now open")

# --- HTTP (http/limits.py, http/observability.py) --------------------------------------------

REFUSED_REQUESTS = Counter(
    "deckhands_gateway_http_refused_total",
    "HTTP requests refused for passing a limit before the app saw them",
    ["limit"],
)
HTTP_REQUESTS = Counter(
    "deckhands_gateway_http_requests_total", "HTTP requests", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "deckhands_gateway_http_request_duration_seconds",
    "Time to answer an HTTP request (for streams: how long they stayed open)",
    ["method", "route"],
)

# --- webhooks (webhooks/sender.py) -----------------------------------------------------------

DELIVERIES = Counter(
    "deckhands_gateway_webhook_attempts_total",
    "Webhook POSTs (or refusals to send one) by outcome",
    ["outcome"],
)
