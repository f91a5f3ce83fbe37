"""The confinement of every container that touches a task's files: its sandbox, the one-shot
workspace helpers (workspace_helper.py) and the keepers of a stopped sandbox's files
(keepers.py).

They all get it from here, so none runs under a weaker OCI runtime or with more privilege than
the sandbox itself: a helper runs `git` over files the tenant controls, and under gVisor a
helper left on runc would be tenant-influenced code on the host's kernel.
"""

from __future__ import annotations

from typing import Any

from docker.types import Ulimit

from .settings import RuntimeSettings

__all__ = ["GVISOR_HOST_PIDS_PER_PROCESS", "OFFLINE", "confinement", "is_gvisor"]

# Creation keys (not host-config ones) of a container on network "none". Without them the
# engine runs its libnetwork prestart hook at every start (dockerd's own binary re-executed):
# on this machine 45 % of a start's CPU (190 of 420 ms; bench/sandbox_start_bench.py) and half
# the sandboxes it could start a second. Disabled networking gives the container the same
# empty network namespace (loopback only, under runc and gVisor alike); the engine then writes
# no /etc/hosts, and the image's libnss-myhostname answers localhost (deploy/sandbox/Dockerfile).
OFFLINE: dict[str, Any] = {"network_disabled": True}
# Under gVisor (ptrace platform), host pids allowed per guest process (see confinement).
GVISOR_HOST_PIDS_PER_PROCESS = 16
# The memory a gVisor sandbox's own kernel (Sentry and gofer, counted in its cgroup) needs
# beside what its processes use.
_GVISOR_OVERHEAD_BYTES = 64 << 20


def is_gvisor(settings: RuntimeSettings) -> bool:
    return (settings.docker_runtime or "").startswith("runsc")


def confinement(
    settings: RuntimeSettings, *, memory_bytes: int, pids: int, init: bool
) -> dict[str, Any]:
    """Host-config keys of a confined container: the configured OCI runtime, no capability,
    no new privileges, a read-only root, bounded processes, memory, CPU, open files and file
    size. `pids`: the guest processes allowed; `memory_bytes`: its memory (and swap) limit."""
    s = settings
    gvisor = is_gvisor(s)
    ulimits = [
        Ulimit(name="nofile", soft=s.sandbox_open_files, hard=s.sandbox_open_files),
        # RLIMIT_FSIZE is in bytes: a write past it fails (EFBIG, or SIGXFSZ).
        Ulimit(name="fsize", soft=s.max_file_bytes, hard=s.max_file_bytes),
    ]
    host_pids = pids
    if gvisor:
        # gVisor's ptrace platform (the only one Debian's runsc has here) backs guest
        # processes with host stub processes and threads, several per guest process and
        # growing with use: a pids cgroup of `pids` ends the whole sandbox ("failed to create
        # new OS thread") after a few dozen commands. The guest's processes are counted by
        # gVisor's own kernel instead (RLIMIT_NPROC, per uid and per sandbox; under runc that
        # limit would count uid 1000 across every container of the host, so it is not set
        # there), and the host's cgroup gets room for the stubs.
        ulimits.append(Ulimit(name="nproc", soft=pids, hard=pids))
        host_pids = pids * GVISOR_HOST_PIDS_PER_PROCESS
    return {
        "read_only": True,
        "cap_drop": ["ALL"],
        "security_opt": ["no-new-privileges"],
        "pids_limit": host_pids,
        "mem_limit": memory_bytes,
        "memswap_limit": memory_bytes,  # equal to the memory limit: no swap
        "nano_cpus": int(s.sandbox_cpus * 1e9),
        "ulimits": ulimits,
        # Not under gVisor: Docker's init then runs the image's tini as its child, which needs
        # PR_SET_CHILD_SUBREAPER that gVisor lacks; tini itself is PID 1 there.
        "init": init and not gvisor,
        "runtime": s.docker_runtime,
        "restart_policy": {"Name": "no"},
    }


def small_container_memory(settings: RuntimeSettings, guest_bytes: int) -> int:
    """Memory of a small confined container whose processes need `guest_bytes`: under gVisor
    its kernel's own memory is counted too."""
    return guest_bytes + (_GVISOR_OVERHEAD_BYTES if is_gvisor(settings) else 0)
