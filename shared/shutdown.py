"""A service's shutdown is bounded.

On SIGTERM FastStream runs the service's shutdown hooks and stops the broker, which waits for
the handlers in flight and closes the connection. When NATS or Redis went away meanwhile, that
can wait for ever: a runtime whose NATS and Redis were killed with it went on for 40 minutes,
its warm pool starting sandboxes the whole time. Kubernetes ends such a pod after its grace
period; `make up`'s stop after 15 s (tools/stack_stop.py); a process stopped by any other means
would stay. So each service exits by itself once `shutdown_timeout_s` has passed since its
shutdown began. Nothing is lost by it: a message not acknowledged is delivered again.
"""

from __future__ import annotations

import logging
import os
import threading

from faststream import FastStream

__all__ = ["EXIT_SHUTDOWN_STUCK", "bound_shutdown", "exit_unless_done_within"]

# EX_TEMPFAIL: the service did not stop cleanly, and may be started again.
EXIT_SHUTDOWN_STUCK = 75

log = logging.getLogger("deckhands.shutdown")


def exit_unless_done_within(timeout_s: float) -> threading.Timer:
    """A deadline for a shutdown that begins now: the process exits (status 75) if it still
    runs `timeout_s` from now, unless the returned timer is cancelled first. A thread, not a
    task: the event loop may be what is stuck."""

    def expire() -> None:
        log.critical(
            "shutdown did not finish within %gs (DECKHANDS_SHUTDOWN_TIMEOUT_S): exiting", timeout_s
        )
        logging.shutdown()
        os._exit(EXIT_SHUTDOWN_STUCK)

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    return timer


def bound_shutdown(app: FastStream, timeout_s: float) -> None:
    """Exit the process if `app`'s stop has not finished `timeout_s` after it began."""
    stop = app.stop

    async def bounded_stop() -> None:
        # Cancelled once the stop is over, so an app stopped inside a longer-lived process (a
        # test) ends nothing.
        deadline = exit_unless_done_within(timeout_s)
        try:
            await stop()
        finally:
            deadline.cancel()

    app.stop = bounded_stop  # type: ignore[method-assign]
