"""nats-py's pull `fetch` ends a fetch that found nothing with a bare `asyncio.TimeoutError` in
one of its paths (when the time left runs out between its two pull requests) and with its own
`nats.errors.TimeoutError` in the others. FastStream's pull loops catch only the latter: a bare
one escapes, FastStream's supervisor restarts the loop, and a batch loop loses the messages it
had fetched before (unacknowledged, they come back only after `ack_wait`). Under load that can
happen on most fetches, so a batch consumer (storage) fell tens of seconds behind. Installed once
by `shared.broker`: every fetch ends with nats' own TimeoutError.
"""

from __future__ import annotations

import functools
from typing import Any

import nats.errors
from nats.js.client import JetStreamContext

__all__ = ["install"]

_MARK = "_deckhands_timeouts_are_nats_errors"


def install() -> None:
    fetch = JetStreamContext.PullSubscription.fetch
    if getattr(fetch, _MARK, False):
        return

    @functools.wraps(fetch)
    async def fetch_with_nats_timeouts(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(self, *args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    setattr(fetch_with_nats_timeouts, _MARK, True)
    JetStreamContext.PullSubscription.fetch = fetch_with_nats_timeouts  # type: ignore[method-assign]
