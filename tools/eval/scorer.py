"""Score a finished task: its check runs on a copy of its final workspace in a fresh container.

Why not in the task's own sandbox: once a task ended, the API offers no command in it (a message
would resume the agent), and its kept sandbox is stopped. The workspace's download (GET
/v1/tasks/{id}/workspace) is exactly what the agent left, so the check runs on that, in a new
container of the same sandbox image, hardened as the runtime's helpers are (uid 1000, no network,
no capability, no-new-privileges, pid and memory limits, a deadline) and removed afterwards. The
check cannot be fooled by what the agent said: only the files decide (plus, for tasks that ask
for an answer, /check/final_message.txt), and its reference files in /check were never in the
agent's sandbox.
"""

from __future__ import annotations

import io
import os
import secrets
import tarfile
import threading
from dataclasses import dataclass
from typing import Any

from .tasks import EvalTask

__all__ = ["CheckResult", "Scorer"]

SANDBOX_IMAGE = os.environ.get(
    "DECKHANDS_SANDBOX_IMAGE", os.environ.get("SANDBOX_IMAGE", "deckhands/sandbox:latest")
)
LABEL = "deckhands.eval-check"
_MAX_OUT = 4000
_UID = 1000


@dataclass(frozen=True)
class CheckResult:
    passed: bool
    exit_code: int
    output: str  # the check's stdout and stderr, its last 4000 characters


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.uid = info.gid = _UID
    tar.addfile(info, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    info.uid = info.gid = _UID
    tar.addfile(info)


def build_archive(task: EvalTask, workspace_tgz: bytes | None, final_message: str) -> bytes:
    """A tar to unpack at / of the check's container: the workspace as downloaded (entries under
    `workspace/`: regular files, directories and symbolic links only, owned by the sandbox user)
    and /check (the task's reference files and the agent's final message)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        _dir(tar, "workspace")
        if workspace_tgz:
            with tarfile.open(fileobj=io.BytesIO(workspace_tgz), mode="r:*") as src:
                for member in src:
                    name = member.name.lstrip("./")
                    if not name.startswith("workspace/") or ".." in name.split("/"):
                        continue
                    if not (member.isfile() or member.isdir() or member.issym()):
                        continue
                    member.name = name
                    member.uid = member.gid = _UID
                    member.uname = member.gname = ""
                    member.mode &= 0o777
                    data = src.extractfile(member) if member.isfile() else None
                    tar.addfile(member, data)
        _dir(tar, "check")
        for rel, content in task.check_files.items():
            _add(tar, f"check/{rel}", content.encode())
        _add(tar, "check/final_message.txt", final_message.encode())
    return out.getvalue()


class Scorer:
    """Runs checks, at most `parallel` containers at once, each within `timeout_s`."""

    def __init__(self, image: str = SANDBOX_IMAGE, timeout_s: float = 120.0, parallel: int = 2):
        import docker

        self.image = image
        self.timeout_s = timeout_s
        try:
            self._client: Any = docker.from_env(timeout=60)
            self._client.api.inspect_image(image)
        except docker.errors.ImageNotFound:
            raise RuntimeError(f"the sandbox image {image} is missing: run `make image`") from None
        except docker.errors.DockerException as exc:
            raise RuntimeError(f"the checks need the Docker engine: {exc}") from None
        self._slots = threading.BoundedSemaphore(parallel)

    def close(self) -> None:
        self._client.close()

    def check(self, task: EvalTask, workspace_tgz: bytes | None, final_message: str) -> CheckResult:
        archive = build_archive(task, workspace_tgz, final_message)
        with self._slots:
            return self._run(task, archive)

    def _run(self, task: EvalTask, archive: bytes) -> CheckResult:
        import requests

        api = self._client.api
        script = f"cd /workspace || exit 90\n{task.check}\n"
        config = api.create_container_config(
            self.image,
            ["bash", "-c", script],
            entrypoint=[],
            user=f"{_UID}:{_UID}",
            working_dir="/workspace",
            environment={"HOME": "/tmp/home", "PYTHONDONTWRITEBYTECODE": "1"},
            labels={LABEL: task.id},
            host_config=api.create_host_config(
                tmpfs={"/tmp": "rw,exec,nosuid,nodev,size=64m,mode=1777"},
                network_mode="none",
                cap_drop=["ALL"],
                security_opt=["no-new-privileges"],
                pids_limit=128,
                mem_limit="512m",
                memswap_limit="512m",
                nano_cpus=int(1e9),
                restart_policy={"Name": "no"},
            ),
        )
        name = f"deckhands-eval-check-{secrets.token_hex(6)}"
        cid = api.create_container_from_config(config, name)["Id"]
        try:
            api.put_archive(cid, "/", archive)
            api.start(cid)
            try:
                status = api.wait(cid, timeout=self.timeout_s)
                code = int(status.get("StatusCode", -1))
                timed_out = False
            except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
                code, timed_out = -1, True
            logs = api.logs(cid, stdout=True, stderr=True, tail=200).decode("utf-8", "replace")
            if timed_out:
                logs += f"\n[the check did not finish in {self.timeout_s:g}s]"
            return CheckResult(code == 0, code, logs[-_MAX_OUT:])
        finally:
            try:
                api.remove_container(cid, force=True, v=True)
            except Exception:
                pass
