"""The storage service's Prometheus metrics (served on /metrics when DECKHANDS_METRICS_PORT is
set)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

__all__ = ["DUPLICATES", "GROUP_SIZE", "HISTORY_ERRORS", "STORED"]

# How well the event log's group commits batch (event_log.py).
GROUP_SIZE = Histogram(
    "deckhands_storage_commit_group_events",
    "Events written by one SQLite commit",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)

# What the handlers did with logged events and history requests (handlers.py).
STORED = Counter("deckhands_storage_events_stored_total", "Events persisted", ["kind"])
DUPLICATES = Counter("deckhands_storage_duplicates_total", "Redelivered events already stored")
HISTORY_ERRORS = Counter(
    "deckhands_storage_history_errors_total", "History requests answered with an error", ["why"]
)
