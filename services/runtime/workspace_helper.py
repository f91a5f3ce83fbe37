"""One-shot helper containers: git and shell work on a task's workspace, outside its sandbox.

A checkout, the baseline of an uploaded tree and a diff run `git` on files the agent (or the
repository) controls: a `.git/config` can name commands (`core.fsmonitor`, `diff.external`,
filters). So they never run in the runtime's process: each runs in a container of the sandbox
image that mounts only the task's workspace volume (read-only unless it must write), as uid
1000, with no network, no capability, a read-only root, a /tmp tmpfs, small pid and memory
limits and a deadline. The worst a hostile repository can do there is what its agent can do
in the sandbox, with less. It works whether the sandbox runs or is stopped (a keeper holds a
stopped sandbox's tmpfs workspace, see keepers.py), and it never touches the agent's shell.

Output: stdout is bounded by the script itself (`head -c`) and read back from the container's
log (text: the JSON log driver keeps UTF-8); stderr's tail says what failed.

Blocking docker-py calls: run on DockerSandboxes' threads.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from typing import IO, Any

import requests
from docker.errors import APIError, NotFound
from docker.types import LogConfig, Mount

from .containers import LABEL_POOL, LABEL_ROLE, DockerSandboxes
from .keepers import WORKSPACE, workspace_volume

__all__ = [
    "HELPER_PREFIX",
    "ROLE_HELPER",
    "HelperResult",
    "HelperTimeout",
    "remove_stray_helpers",
    "run_helper",
]

log = logging.getLogger("deckhands.runtime.workspace")

HELPER_PREFIX = "deckhands-ws-"
ROLE_HELPER = "workspace-helper"
_ERR_TAIL = 4000


class HelperTimeout(Exception):
    """The helper did not finish in time (it was killed)."""


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
        environment={"HOME": "/tmp/home", **env},
        labels={LABEL_ROLE: ROLE_HELPER, LABEL_POOL: s.pool_name},
        host_config=api.create_host_config(
            mounts=[Mount(WORKSPACE, volume, type="volume", read_only=not writable)],
            tmpfs={"/tmp": f"rw,exec,nosuid,nodev,size={s.sandbox_tmp_size},mode=1777"},
            network_mode="none",
            read_only=True,
            cap_drop=["ALL"],
            security_opt=["no-new-privileges"],
            pids_limit=128,
            mem_limit="512m",
            memswap_limit="512m",
            nano_cpus=int(1e9),
            log_config=LogConfig(
                type="json-file",
                config={"max-size": str(2 * max_out + 2 * _ERR_TAIL + (1 << 20)), "max-file": "1"},
            ),
            restart_policy={"Name": "no"},
        ),
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
