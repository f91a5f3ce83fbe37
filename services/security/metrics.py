"""The security monitor's Prometheus metrics (served on /metrics when DECKHANDS_METRICS_PORT is
set)."""

from __future__ import annotations

from prometheus_client import Counter

__all__ = ["VERDICTS"]

VERDICTS = Counter(
    "deckhands_security_verdicts_total", "Security verdicts", ["verdict", "risk", "rule"]
)
