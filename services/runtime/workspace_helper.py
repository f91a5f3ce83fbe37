"""One-shot helper containers: git and shell work on a task's workspace, outside its sandbox.

A checkout, the baseline of an uploaded tree and a diff run `git` on files the agent (or the
repository) controls. So they never run in the runtime's process: each runs in a container of
the sandbox image that mounts only the task's workspace volume (read-only unless it must
write), as uid 1000, with no network, confined exactly as the sandbox is (isolation.py: the
same OCI runtime, gVisor included, no capability, a read-only root, the sandbox's memory,
process and CPU limits), a /tmp tmpfs and a deadline; one at a time per sandbox, so a tenant
has at most as many helpers as it has sandboxes. The git they run never reads a
configuration the workspace holds (see GIT_PREAMBLE). It works whether the sandbox runs, is
paused or is stopped (a keeper holds a stopped sandbox's tmpfs workspace, see keepers.py),
and it never touches the agent's shell.

Output: stdout is bounded by the script itself (`head -c`) and read back from the container's
log (text: the JSON log driver keeps UTF-8); stderr's tail says what failed.

Blocking docker-py calls: run on DockerSandboxes' threads.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import IO, Any

import requests
from docker.errors import APIError, NotFound
from docker.types import LogConfig, Mount

from .containers import LABEL_POOL, LABEL_ROLE, DockerSandboxes
from .errors import HelperTimeout
from .isolation import OFFLINE, confinement
from .keepers import WORKSPACE, workspace_volume

__all__ = [
    "HELPER_PREFIX",
    "ROLE_HELPER",
    "HelperResult",
    "remove_stray_helpers",
    "run_helper",
]

log = logging.getLogger("deckhands.runtime.workspace")

HELPER_PREFIX = "deckhands-ws-"
ROLE_HELPER = "workspace-helper"
_ERR_TAIL = 4000
_HELPER_PIDS = 128
# No configuration but the helper's own: no system or global file, no attributes file of the
# image's, nothing asked of a terminal, no pager. The repository's own configuration is kept
# out by GIT_PREAMBLE.
_GIT_ENV = {
    "HOME": "/tmp/home",
    "XDG_CONFIG_HOME": "/tmp/home/.config",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "PAGER": "cat",
    "GIT_OPTIONAL_LOCKS": "0",
}
# One helper at a time per sandbox (by container id): a tenant's helpers are bounded by its
# sandboxes, however many requests it sends at once.
_per_sandbox: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class HelperResult:
    exit_code: int
    stderr: str
    truncated: bool  # stdout passed its limit


def _script(body: str, max_out: int) -> str:
    # The body's stdout goes to a file first: its exit code survives, and what the log keeps is
    # bounded (a json-file log past its size would rotate and lose its beginning).
    return (
        'mkdir -p "$HOME"; cd /workspace || exit 90\n'
        f"( {body}\n) > /tmp/.out 2> /tmp/.err; rc=$?\n"
        f"head -c {max_out + 1} /tmp/.out; tail -c {_ERR_TAIL} /tmp/.err >&2; exit $rc\n"
    )


def _run_sync(
    docker: DockerSandboxes,
    container_id: str,
    body: str,
    env: dict[str, str],
    writable: bool,
    timeout_s: float,
    out: IO[bytes],
    max_out: int,
) -> HelperResult:
    api: Any = docker.api()
    s = docker.settings
    volume = workspace_volume(api, container_id)
    config = api.create_container_config(
        s.sandbox_image,
        ["bash", "-c", _script(body, max_out)],
        entrypoint=[],
        user="1000:1000",
        working_dir=WORKSPACE,
        environment={**env, **_GIT_ENV},
        labels={LABEL_ROLE: ROLE_HELPER, LABEL_POOL: s.pool_name},
        host_config=api.create_host_config(
            **confinement(
                s,
                memory_bytes=s.container_memory_bytes_for(None),
                pids=min(_HELPER_PIDS, s.sandbox_pids),
                init=s.docker_init,
            ),
            mounts=[Mount(WORKSPACE, volume, type="volume", read_only=not writable)],
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={s.sandbox_tmp_size},mode=1777"},
            network_mode="none",
            log_config=LogConfig(
                type="json-file",
                config={"max-size": str(2 * max_out + 2 * _ERR_TAIL + (1 << 20)), "max-file": "1"},
            ),
        ),
        **OFFLINE,
    )
    name = HELPER_PREFIX + secrets.token_hex(6)
    cid = api.create_container_from_config(config, name)["Id"]
    try:
        api.start(cid)
        try:
            status = api.wait(cid, timeout=timeout_s)
        except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
            raise HelperTimeout(f"the workspace helper did not finish in {timeout_s:g}s") from None
        written = 0
        truncated = False
        for chunk in api.logs(cid, stdout=True, stderr=False, stream=True, follow=False):
            if written + len(chunk) > max_out:
                out.write(chunk[: max_out - written])
                truncated = True
                break
            out.write(chunk)
            written += len(chunk)
        err = api.logs(cid, stdout=False, stderr=True).decode("utf-8", "replace")
        return HelperResult(int(status.get("StatusCode", -1)), err[-_ERR_TAIL:], truncated)
    finally:
        try:
            api.remove_container(cid, force=True)  # not v=True: the volume is the sandbox's
        except NotFound:
            pass
        except APIError as exc:
            log.warning("could not remove workspace helper %s: %s", cid[:12], exc)


async def run_helper(
    docker: DockerSandboxes,
    container_id: str,
    body: str,
    *,
    out: IO[bytes],
    max_out: int,
    timeout_s: float,
    writable: bool = False,
    env: dict[str, str] | None = None,
) -> HelperResult:
    """Run the bash `body` in /workspace of the sandbox `container_id` (running or stopped) in a
    helper container; its stdout (at most `max_out` bytes) goes to `out`."""
    lock = _per_sandbox.get(container_id)
    if lock is None:
        lock = _per_sandbox[container_id] = asyncio.Lock()
    async with lock:
        return await docker.call(
            _run_sync, docker, container_id, body, env or {}, writable, timeout_s, out, max_out
        )


def remove_stray_helpers(docker: DockerSandboxes, min_age_s: float) -> int:
    """Helpers a crash left behind (blocking)."""
    api: Any = docker.api()
    filters = [f"{LABEL_ROLE}={ROLE_HELPER}", f"{LABEL_POOL}={docker.settings.pool_name}"]
    removed = 0
    for raw in api.containers(all=True, filters={"label": filters}):
        if time.time() - float(raw.get("Created") or 0) < min_age_s:
            continue
        try:
            api.remove_container(raw["Id"], force=True)
            removed += 1
        except (NotFound, APIError):
            pass
    return removed
