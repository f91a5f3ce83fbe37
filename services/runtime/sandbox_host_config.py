"""The hardening every sandbox gets, as Docker host-config keys; see docs/runtime.md.

Its confinement (OCI runtime, no capability, read-only root, limits) is the one every container
touching a task's files gets (isolation.py); on top: its network, a /workspace volume (a sized
tmpfs, or a volume on the engine's disk), a /tmp tmpfs and a capped log.
"""

from __future__ import annotations

from typing import Any

from docker.types import DriverConfig, LogConfig, Mount

from shared.egress_policy import SANDBOX_EGRESS_MOUNT, SANDBOX_TRUST_DIR

from .isolation import OFFLINE, confinement
from .sandbox_labels import LABEL_POOL, LABEL_ROLE, NO_NETWORK, ROLE_SANDBOX
from .settings import RuntimeSettings

__all__ = ["sandbox_container_config", "sandbox_host_config"]


def sandbox_host_config(
    settings: RuntimeSettings,
    network: str,
    workspace_bytes: int | None = None,
    egress_folder: str | None = None,
) -> dict[str, Any]:
    """The host config of a sandbox on `network`. `workspace_bytes`: a task's own /workspace
    quota instead of the default. `egress_folder`: its folder for the egress proxy, mounted
    read-only (its only way out: such a sandbox has no network)."""
    s = settings
    files = f"nr_inodes={s.sandbox_inodes}"
    tmpfs = {"/tmp": f"rw,exec,nosuid,nodev,size={s.sandbox_tmp_size},{files},mode=1777"}
    # Without a quota: a volume on the engine's disk, with no size limit.
    driver = None
    quota = workspace_bytes or s.workspace_bytes
    if quota is not None:
        # The quota: a local volume of type tmpfs, so the kernel answers ENOSPC past its
        # bytes or files, on any engine and storage driver, with no privilege (Docker's
        # local volumes have no size option, a loop-mounted image needs root on the engine's
        # host, fuse-overlayfs no quotas). Its pages are memory charged to the sandbox (see
        # container_memory_bytes); a keeper holds it mounted across a stop (keepers.py).
        options = f"size={quota},{files},uid=1000,gid=1000,mode=0755"
        driver = DriverConfig("local", {"type": "tmpfs", "device": "tmpfs", "o": options})
    # Anonymous: removed with the container (`remove(v=True)`), pruned by label if a crash
    # left it behind.
    workspace = Mount(
        "/workspace",
        None,
        type="volume",
        labels={LABEL_ROLE: ROLE_SANDBOX, LABEL_POOL: s.pool_name},
        driver_config=driver,
    )
    config = confinement(
        s,
        memory_bytes=s.container_memory_bytes_for(workspace_bytes),
        pids=s.sandbox_pids,
        init=s.docker_init,
    )
    mounts = [workspace]
    if egress_folder is not None:
        mounts.append(Mount(SANDBOX_EGRESS_MOUNT, egress_folder, type="bind", read_only=True))
        # Where the holder writes the bundle that trusts the egress CA (root's, 0755).
        tmpfs[SANDBOX_TRUST_DIR] = "rw,noexec,nosuid,nodev,size=2m,nr_inodes=16,mode=0755"
    return {
        **config,
        "network_mode": network,
        "mounts": mounts,
        "tmpfs": tmpfs,
        # Only for the image's holder.py, which starts as root, forks the executor as the
        # sandbox user and then leaves root itself: both setuids clear every capability,
        # so no process the agent can reach has any (no-new-privileges keeps it so).
        "cap_add": ["SETUID", "SETGID"],
        "log_config": LogConfig(
            type="json-file", config={"max-size": s.sandbox_log_max_size, "max-file": "1"}
        ),
    }


def sandbox_container_config(
    api: Any,
    settings: RuntimeSettings,
    labels: dict[str, str],
    environment: dict[str, str],
    host_config: dict[str, Any],
) -> dict[str, Any]:
    """The whole creation request of a sandbox (docker-py's low-level `api`)."""
    config: dict[str, Any] = api.create_container_config(
        settings.sandbox_image,
        None,
        labels=labels,
        stdin_open=True,  # the executor's request channel
        tty=False,
        # Root only for Docker's init, tini and the start of holder.py: the agent's commands
        # run as uid 1000, the channel is held by uid 999 (see holder.py).
        user="0:0",
        working_dir="/workspace",
        hostname="sandbox",
        environment=environment,
        host_config=api.create_host_config(**host_config),
        **(OFFLINE if host_config["network_mode"] == NO_NETWORK else {}),
    )
    # docker-py sets StdinOnce with stdin_open, which would close the executor's stdin when
    # the first client detaches; a restarted runtime must be able to re-attach.
    config["StdinOnce"] = False
    return config
