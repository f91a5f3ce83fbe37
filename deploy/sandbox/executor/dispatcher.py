"""The executor's main loop: request lines from stdin, answered from the first one on.

Start-up time counts (every new sandbox pays it), so this module, like the package's
`__init__`, `config` and `shared.sandbox_protocol`, imports only built-in modules: a ping is
answered at once while `_boot` loads the rest (workers.py and the sessions) in a background
thread; the other requests wait for it, in order.
"""

from __future__ import annotations

import _thread
import os
import sys
import time

from shared.sandbox_protocol import PROTOCOL_VERSION

from .config import log

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Dispatcher", "main"]

STARTED = time.monotonic()


def _ping_id(line: bytes) -> str | None:
    """The id of a ping request, read without the json module (not loaded yet at boot)."""
    if b'"op": "ping"' not in line and b'"op":"ping"' not in line:
        return None
    for key in (b'"id": "', b'"id":"'):
        start = line.find(key)
        if start >= 0:
            start += len(key)
            end = line.find(b'"', start)
            rid = line[start:end]
            if end > start and rid.isascii() and b"\\" not in rid:
                return rid.decode()
    return None


class Dispatcher:
    """Routes request lines; until the sessions are loaded it answers pings and holds the rest.

    The same lock orders held and new lines, so requests keep their order across the switch.
    """

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.write_lock = _thread.allocate_lock()
        self.held: list[bytes] = []
        self.route: Callable[[bytes], None] | None = None

    def write(self, data: bytes) -> None:
        """Write whole lines to stdout; the lock keeps them whole across threads."""
        with self.write_lock:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()

    def feed(self, line: bytes) -> None:
        with self.lock:
            if self.route is None:
                rid = _ping_id(line)
                if rid is None:
                    self.held.append(line)
                else:
                    self.write(
                        b'{"id": "'
                        + rid.encode()
                        + b'", "ok": true, "pid": '
                        + str(os.getpid()).encode()
                        + b', "protocol": '
                        + str(PROTOCOL_VERSION).encode()
                        + b', "booting": true}\n'
                    )
                return
            self.route(line)

    def ready(self, route: Callable[[bytes], None]) -> None:
        """Route every line from now on with `route`, the held ones first."""
        with self.lock:
            self.route = route
            for line in self.held:
                route(line)
            self.held.clear()


def _boot(dispatcher: Dispatcher) -> None:
    """Load the sessions, start their workers, then take over from the boot."""
    try:
        from .workers import start

        dispatcher.ready(start(dispatcher.write, STARTED))
    except BaseException as exc:  # without its machinery the executor is useless: exit loudly
        log(f"boot failed: {type(exc).__name__}: {exc}")
        os._exit(70)


def main() -> None:
    dispatcher = Dispatcher()
    _thread.start_new_thread(_boot, (dispatcher,))
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        dispatcher.feed(line)
    log("stdin closed; exiting")
