"""A provider's limits on chat requests, as the scripted server keeps them, and the most of each
it saw.

A provider's limits, for tests and benchmarks that check deckhands never exceeds them and
waits out a 429 (each key optional; none by default)::

    "limits": {
      "max_concurrent": 20,           # chat requests being answered at once
      "requests_per_minute": 600,     # requests admitted in the last 60 s (a sliding window)
      "tokens_per_minute": 100000,    # their prompt + completion tokens in the last 60 s
      "retry_after_s": 1.0            # the Retry-After of a 429 for max_concurrent
    }

or on the command line, which wins over the script: `--max-concurrent N`,
`--requests-per-minute N`, `--tokens-per-minute N`. A chat request beyond a limit is answered
at once with a 429 {"error": {"type": "rate_limit_error", "code": "rate_limit_exceeded", ...}}
and a Retry-After header in seconds: `retry_after_s` (as in "1" or "0.5") for max_concurrent;
for the per-minute limits the whole seconds, 1 to 60, until the window has room for it again.
A request counts as being answered from its arrival until its reply is ready (`delay_s` and
`fail_first` included); its prompt tokens enter the window when it arrives (a request is
refused when they would take the window over the limit; one larger than the limit itself
always is, with Retry-After 60), its completion tokens when it is answered. A refused request
counts toward no window, nor in /stats `requests` and `tasks` (nor /prompts): /stats
`refused_429` counts them, and `max_concurrent_seen`, `max_requests_in_60s` (measured at each
admitted request's arrival) and `max_tokens_in_60s` are the most the admitted ones reached,
limits or not. A body whose `messages` cannot be read is answered 400 before the limits.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

from .replies import HttpError
from .script import Limits

__all__ = ["LIMIT_WINDOW_S", "Limiter"]

# The sliding window of the per-minute limits, and of the /stats maxima over it.
LIMIT_WINDOW_S = 60.0


def _rate_limited(message: str, retry_after_s: float) -> HttpError:
    return HttpError(
        429, message, "rate_limit_error", code="rate_limit_exceeded", retry_after_s=retry_after_s
    )


class Limiter:
    """A provider's limits on chat requests, and the most of each the server saw; thread-safe.

    A request counts as concurrent from its admission until its answer is ready; its prompt
    tokens enter the 60 s window when it is admitted, its completion tokens when it is answered.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._in_flight = 0
        self._arrivals: deque[float] = deque()  # the admitted requests of the last 60 s
        self._tokens: deque[tuple[float, int]] = deque()  # (when, tokens) of the last 60 s
        self._window_tokens = 0
        self._refused = 0
        self._max_concurrent = 0
        self._max_requests = 0
        self._max_tokens = 0

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "refused_429": self._refused,
                "max_concurrent_seen": self._max_concurrent,
                "max_requests_in_60s": self._max_requests,
                "max_tokens_in_60s": self._max_tokens,
            }

    def admit(self, prompt_tokens: int) -> None:
        """Let a request in, or raise the 429 a provider would answer it with."""
        with self._lock:
            now = time.monotonic()
            self._prune(now)
            refusal = self._refusal(now, prompt_tokens)
            if refusal is not None:
                self._refused += 1
                raise refusal
            self._in_flight += 1
            self._max_concurrent = max(self._max_concurrent, self._in_flight)
            self._arrivals.append(now)
            self._max_requests = max(self._max_requests, len(self._arrivals))
            self._add_tokens(now, prompt_tokens)

    def done(self, completion_tokens: int) -> None:
        """An admitted request was answered (completion_tokens 0: with an error)."""
        with self._lock:
            self._in_flight -= 1
            if completion_tokens:
                now = time.monotonic()
                self._prune(now)
                self._add_tokens(now, completion_tokens)

    def _prune(self, now: float) -> None:
        start = now - LIMIT_WINDOW_S
        while self._arrivals and self._arrivals[0] <= start:
            self._arrivals.popleft()
        while self._tokens and self._tokens[0][0] <= start:
            self._window_tokens -= self._tokens.popleft()[1]

    def _add_tokens(self, now: float, tokens: int) -> None:
        self._tokens.append((now, tokens))
        self._window_tokens += tokens
        self._max_tokens = max(self._max_tokens, self._window_tokens)

    @staticmethod
    def _until_gone(now: float, when: float) -> float:
        """Whole seconds (at least 1) until what happened at `when` leaves the window."""
        return float(max(1, math.ceil(when + LIMIT_WINDOW_S - now)))

    def _refusal(self, now: float, prompt_tokens: int) -> HttpError | None:
        limits = self.limits
        if limits.max_concurrent is not None and self._in_flight >= limits.max_concurrent:
            return _rate_limited(
                f"Rate limit reached for concurrent requests: Limit {limits.max_concurrent}, "
                f"Used {self._in_flight}, Requested 1.",
                limits.retry_after_s,
            )
        rpm, used = limits.requests_per_minute, len(self._arrivals)
        if rpm is not None and used >= rpm:
            # Room again once all but rpm - 1 of the window's requests have left it.
            wait = self._until_gone(now, self._arrivals[used - rpm])
            return _rate_limited(
                f"Rate limit reached for requests per min (RPM): Limit {rpm}, Used {used}, "
                f"Requested 1. Please try again in {wait:g}s.",
                wait,
            )
        tpm = limits.tokens_per_minute
        if tpm is not None and self._window_tokens + prompt_tokens > tpm:
            if prompt_tokens > tpm:  # never fits: OpenAI answers it with a 429 too
                return _rate_limited(
                    f"Request too large for tokens per min (TPM): Limit {tpm}, "
                    f"Requested {prompt_tokens}.",
                    LIMIT_WINDOW_S,
                )
            # Room again once enough of the oldest tokens have left the window.
            excess, frees = self._window_tokens + prompt_tokens - tpm, now
            for when, tokens in self._tokens:
                excess -= tokens
                if excess <= 0:
                    frees = when
                    break
            wait = self._until_gone(now, frees)
            return _rate_limited(
                f"Rate limit reached for tokens per min (TPM): Limit {tpm}, Used "
                f"{self._window_tokens}, Requested {prompt_tokens}. Please try again in "
                f"{wait:g}s.",
                wait,
            )
        return None
