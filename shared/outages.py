"""Telling a JetStream outage from a failure of the message itself.

While a stream has no leader (a JetStream cluster electing a new one after losing a server
takes a few seconds) a publish to it finds no responder, or JetStream answers 503. Nothing is
wrong with the message being handled: it must be retried until the stream is back, not counted
towards the deliveries after which a message is dead-lettered as poison.
"""

from __future__ import annotations

from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError

__all__ = ["is_jetstream_outage"]

_UNAVAILABLE = 503


def is_jetstream_outage(exc: BaseException) -> bool:
    """True for an error (or one it was raised from) that says JetStream cannot answer now."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, NoStreamResponseError | ServiceUnavailableError):
            return True
        if isinstance(current, APIError) and current.code == _UNAVAILABLE:
            return True
        current = current.__cause__ or current.__context__
    return False
