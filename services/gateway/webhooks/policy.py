"""How webhooks are delivered: timeouts, the retry schedule, which targets, how many at once."""

from __future__ import annotations

import random

__all__ = ["DeliveryPolicy"]


class DeliveryPolicy:
    def __init__(
        self,
        *,
        timeout_s: float,
        backoff_s: float,
        backoff_max_s: float,
        deadline_s: float,
        max_attempts: int,
        allow_private: bool,
        concurrency: int,
    ) -> None:
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.deadline_s = deadline_s
        self.max_attempts = max_attempts
        self.allow_private = allow_private
        self.concurrency = concurrency

    def backoff(self, attempts: int) -> float:
        """Delay after the `attempts`-th failure: doubling, capped, up to 10% jitter."""
        delay = min(self.backoff_s * 2.0 ** (attempts - 1), self.backoff_max_s)
        return delay * (1 + random.random() / 10)
