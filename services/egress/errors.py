"""Why the egress proxy refuses a connection: each is the text of the 403 the agent reads."""

from __future__ import annotations

__all__ = ["Refused"]


class Refused(Exception):
    """A connection the task's policy does not allow; `reason` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
