"""Stopping what the local stack started: each process group, gently then by force, and the
sandbox containers and workspace volumes of its pool, which a killed runtime leaves behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

__all__ = ["gone", "remove_sandboxes", "signal_group", "terminate_all"]


def gone(pid: int) -> bool:
    """Whether the process has exited (reaped, if it is a child of this one)."""
    try:
        # Reap it if it is our child (a zombie still answers kill(pid, 0)).
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to the process group `pid` leads (each process starts its own), if any."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def terminate_all(pids: list[int], grace_s: float = 15.0) -> None:
    """SIGTERM every process group at once, then SIGKILL what outlives the grace period."""
    for pid in pids:
        signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = [p for p in pids if not gone(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [p for p in alive if not gone(p)]
    for pid in alive:
        signal_group(pid, signal.SIGKILL)
        gone(pid)


_REMOVALS_AT_ONCE = 4


def remove_sandboxes(pool_name: str) -> None:
    """`make down` leaves no container and no workspace volume behind, even if the runtime was
    killed: `-v` removes each container's anonymous /workspace volume with it, and the prune
    takes the volumes of containers removed without it (a crash between the two)."""
    # Every container of the pool: sandboxes, and the workspace keepers and helpers that hold
    # their volumes (an ended task's sandbox is kept stopped with a keeper for a while).
    ids = subprocess.run(
        [
            "docker",
            "ps",
            "-aq",
            "--filter",
            f"label=deckhands.pool={pool_name}",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.split()
    # A few at a time: the CLI removes the containers of one call side by side, and this
    # engine (20.10, fuse-overlayfs) has wedged after a burst of concurrent removals.
    for start in range(0, len(ids), _REMOVALS_AT_ONCE):
        subprocess.run(
            ["docker", "rm", "-f", "-v", *ids[start : start + _REMOVALS_AT_ONCE]],
            capture_output=True,
            check=False,
            timeout=120,
        )
    subprocess.run(
        [
            "docker",
            "volume",
            "prune",
            "-f",
            "--filter",
            "label=deckhands.role=sandbox",
            "--filter",
            f"label=deckhands.pool={pool_name}",
        ],
        capture_output=True,
        check=False,
        timeout=120,
    )
    # This engine (20.10) does not prune a local volume created with options, which a tmpfs
    # workspace is: the pool's volumes left are removed by name (one still in use stays).
    left = subprocess.run(
        ["docker", "volume", "ls", "-q", "--filter", f"label=deckhands.pool={pool_name}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    ).stdout.split()
    if left:
        subprocess.run(
            ["docker", "volume", "rm", *left], capture_output=True, check=False, timeout=120
        )
