"""The accept path first for the CPU, when the whole system shares one machine (`make up`).

On one host every process of the stack competes for the same cores. Linux (with
sched_autogroup, the default of most distributions) shares the CPU equally between sessions,
and every process the stack starts is a session of its own: when 500 tasks arrive at once the
gateway gets one share among a dozen busy ones (the controllers, reasoners, runtime and storage
working on the tasks it accepted, the engine starting their sandboxes). Measured with 500 POSTs
from 50 clients right after start: the gateway's thread was runnable but waiting for a CPU in
four samples of five, and a POST took 1.5 s at the median against 0.2 s on an idle machine.

Accepting a task is a durable enqueue and should not wait behind the work it enqueues (issue
25). The gateway and the two stores every step of that path waits on (NATS, Redis) are
therefore given a larger share: their session's autogroup, and their processes, at nice -10
(about nine times the weight of a default session). They use little CPU in all, and only when
there is work on that path; the workers still get every cycle the accept path leaves.

Kubernetes does the same with CPU requests (deploy/k8s/base: the gateway's pods request their
share), compose with cpu_shares. Raising a priority needs CAP_SYS_NICE: without it the stack
runs as before, and says so once.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ACCEPT_PATH", "ACCEPT_PATH_NICE", "favour", "on_accept_path"]

# Processes on the accept path, by the stack's names for them (`nats-0` is a `nats`).
ACCEPT_PATH = ("gateway", "nats", "redis")
ACCEPT_PATH_NICE = -10

_said = False


def on_accept_path(name: str) -> bool:
    return any(name == part or name.startswith(f"{part}-") for part in ACCEPT_PATH)


def favour(pid: int, nice: int = ACCEPT_PATH_NICE) -> bool:
    """Give the session led by `pid` (a process started with start_new_session) a larger CPU
    share; False, said once on stderr, when this process may not."""
    global _said
    try:
        # Every thread of the group, Go's (nats-server) and redis-server's included.
        os.setpriority(os.PRIO_PGRP, pid, nice)
        autogroup = f"/proc/{pid}/autogroup"
        if os.path.exists(autogroup):  # where the kernel shares the CPU between sessions
            with open(autogroup, "w") as f:
                f.write(str(nice))
        return True
    except ProcessLookupError:
        return False  # it ended already; whoever waits for it will say why
    except PermissionError:
        if not _said:
            _said = True
            print(
                "stack: cannot raise the gateway's, NATS' and Redis' CPU priority "
                "(no CAP_SYS_NICE); under a burst, accepting tasks waits for the CPU "
                "behind the workers",
                file=sys.stderr,
            )
        return False
