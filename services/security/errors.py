"""What can go wrong in the security monitor: every exception of its own derives from
SecurityError (it defines none other yet)."""

from __future__ import annotations

__all__ = ["SecurityError"]


class SecurityError(Exception):
    """The root of the security monitor's own exceptions: a review it could not give."""
