"""Where the sandboxes' egress folders are kept: a folder this runtime shares with the engine, or
one only the engine's host has, written through a helper container.

Both keep the same files (egress_folders.py says which, and why); they differ in who writes them:

- `LocalFolders` (DECKHANDS_EGRESS_DIR): a folder this process and the engine both see (`make
  up`, compose, the base's pod with its Docker-in-Docker sidecar).
- `EngineFolders` (DECKHANDS_EGRESS_ENGINE_DIR): a folder on the engine's host only, for a
  runtime that reaches its engine over TCP and may mount nothing of the node (Pod Security
  "restricted": components/gvisor-sandbox-nodes). A helper container of the sandbox image, with
  that folder mounted and no network, runs one small program (`HELPER_PROGRAM`) that takes each
  change as a line on its attached stdin and answers on its stdout, as the sandbox's executor
  does (executor_client.py): a round trip, not a process per change (a `docker exec` each took
  62 ms here, bench/egress_folders_bench.py). A policy is written whole and renamed into place,
  as locally. The helper runs no tenant code and no shell, and checks each name it is given.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

import docker.errors

from shared.sandbox_protocol.session import SandboxLost

from .executor_client import ExecutorClient, open_attach_socket
from .sandbox_labels import LABEL_POOL, LABEL_REPLICA, LABEL_ROLE

__all__ = [
    "HELPER_PROGRAM",
    "ROLE_EGRESS_FOLDERS",
    "VALID_TOKEN",
    "EngineFolders",
    "FolderStore",
    "LocalFolders",
]

ROLE_EGRESS_FOLDERS = "egress-folders"
VALID_TOKEN = re.compile(r"^sbx-[0-9a-f]{16}$")
_MOUNT = "/folders"


class FolderStore(Protocol):
    """The folders of sandboxes with a network policy, named by tokens this runtime made."""

    def path(self, token: str) -> str:
        """The folder's path on the engine's host: what the sandbox mounts."""
        ...

    async def make(self, token: str, files: dict[str, bytes]) -> None: ...

    async def write(self, token: str, name: str, data: bytes) -> None:
        """Whole or absent: a proxy replica never reads half of it."""
        ...

    async def read(self, token: str, name: str) -> bytes | None: ...

    async def remove(self, token: str) -> None: ...

    async def sweep(self, live: set[str], min_age_s: float) -> int:
        """Remove the folders of sandboxes not in `live` older than `min_age_s`: how many."""
        ...

    async def close(self) -> None: ...


def _named(token: str) -> str:
    if not VALID_TOKEN.match(token):
        raise ValueError(f"not an egress folder's token: {token!r}")
    return token


class LocalFolders:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def path(self, token: str) -> str:
        return str(self.root / _named(token))

    async def make(self, token: str, files: dict[str, bytes]) -> None:
        folder = self.root / _named(token)
        folder.mkdir(mode=0o755, parents=True)
        folder.chmod(0o755)
        for name, data in files.items():
            await self.write(token, name, data)

    async def write(self, token: str, name: str, data: bytes) -> None:
        folder = self.root / _named(token)
        written = folder / (name + ".new")
        written.write_bytes(data)
        written.chmod(0o644)
        os.replace(written, folder / name)

    async def read(self, token: str, name: str) -> bytes | None:
        try:
            return (self.root / _named(token) / name).read_bytes()
        except OSError:
            return None

    async def remove(self, token: str) -> None:
        shutil.rmtree(self.root / _named(token), ignore_errors=True)

    async def sweep(self, live: set[str], min_age_s: float) -> int:
        if not self.root.is_dir():
            return 0
        removed = 0
        now = time.time()
        for entry in self.root.iterdir():
            if not VALID_TOKEN.match(entry.name) or entry.name in live:
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime >= min_age_s:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
        return removed

    async def close(self) -> None:
        pass


# The helper's one process: a request per line on its stdin ({"id", "op", ...}), an answer per
# line on its stdout with the same id (the executor's framing, executor_client.py); file
# contents come base64-encoded. It runs no shell and takes no name it did not check.
HELPER_PROGRAM = r"""
import base64, json, os, re, shutil, sys, time
root = sys.argv[1]
def folder(token):
    assert re.fullmatch(r"sbx-[0-9a-f]{16}", token), token
    return os.path.join(root, token)
def write(token, name, data):
    assert re.fullmatch(r"[a-z][a-z0-9_.-]{0,40}", name), name
    new = os.path.join(folder(token), name + ".new")
    with open(new, "wb") as f:
        f.write(base64.b64decode(data))
    os.chmod(new, 0o644)
    os.replace(new, os.path.join(folder(token), name))
def make(token, owner, files):
    os.makedirs(folder(token), 0o755, exist_ok=True)
    os.chown(folder(token), owner, owner)
    os.chmod(folder(token), 0o755)
    for name, data in files:
        write(token, name, data)
def sweep(min_age, live):
    removed = 0
    for entry in os.scandir(root):
        if re.fullmatch(r"sbx-[0-9a-f]{16}", entry.name) and entry.name not in live:
            if time.time() - entry.stat().st_mtime >= min_age:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed
for line in sys.stdin:
    answer = {"id": None, "ok": True}
    try:
        ask = json.loads(line)
        answer["id"] = ask["id"]
        op = ask["op"]
        if op == "make":
            make(ask["token"], int(ask["owner"]), ask["files"])
        elif op == "write":
            write(ask["token"], ask["name"], ask["data"])
        elif op == "remove":
            shutil.rmtree(folder(ask["token"]), ignore_errors=True)
        elif op == "sweep":
            answer["removed"] = sweep(float(ask["min_age_s"]), set(ask["live"]))
        elif op != "ping":
            raise ValueError("unknown op " + repr(op))
    except Exception as exc:
        answer.update(ok=False, error=type(exc).__name__ + ": " + str(exc))
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"""
_COMMAND = ["python3", "-u", "-c", HELPER_PROGRAM, _MOUNT]
_WAIT_S = 30.0


class EngineFolders:
    """`call` runs a blocking function on the runtime's Docker threads; `api` is docker-py's
    low-level client; `root` the folder on the engine's host; `owner` the uid (and gid) of the
    egress proxy there, which listens in each folder."""

    def __init__(
        self,
        call: Callable[..., Awaitable[Any]],
        api: Callable[[], Any],
        root: str,
        image: str,
        owner: int,
        pool: str,
        replica: str,
    ) -> None:
        self.root, self.image, self.owner = root.rstrip("/"), image, owner
        self._call, self._api = call, api
        self.labels = {LABEL_ROLE: ROLE_EGRESS_FOLDERS, LABEL_POOL: pool, LABEL_REPLICA: replica}
        self.name = re.sub(r"[^a-zA-Z0-9_.-]", "-", f"deckhands-egress-folders-{pool}-{replica}")
        # What this runtime last wrote (a restarted one writes once more): no read through
        # the engine for a policy that did not change.
        self._written: dict[tuple[str, str], bytes] = {}
        self._channel: ExecutorClient | None = None
        self._connecting = asyncio.Lock()

    @property
    def _bind(self) -> str:
        return f"{self.root}:{_MOUNT}:rw"

    def path(self, token: str) -> str:
        return f"{self.root}/{_named(token)}"

    async def make(self, token: str, files: dict[str, bytes]) -> None:
        encoded = [[name, base64.b64encode(data).decode()] for name, data in files.items()]
        await self._run("make", token=_named(token), owner=self.owner, files=encoded)
        self._written.update({(token, name): data for name, data in files.items()})

    async def write(self, token: str, name: str, data: bytes) -> None:
        encoded = base64.b64encode(data).decode()
        await self._run("write", token=_named(token), name=name, data=encoded)
        self._written[(token, name)] = data

    async def read(self, token: str, name: str) -> bytes | None:
        return self._written.get((token, name))

    async def remove(self, token: str) -> None:
        await self._run("remove", token=_named(token))
        for key in [k for k in self._written if k[0] == token]:
            del self._written[key]

    async def sweep(self, live: set[str], min_age_s: float) -> int:
        answer = await self._run("sweep", min_age_s=min_age_s, live=sorted(live))
        return int(answer.get("removed", 0))

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def _run(self, op: str, **fields: Any) -> dict[str, Any]:
        """One change; sent again once over a new channel if the helper was gone (restarted,
        removed): every change is one that may be done twice."""
        for attempt in (1, 2):
            channel = await self._connected()
            try:
                answer = await channel.exchange(op, fields, _WAIT_S)
                break
            except SandboxLost as exc:
                if attempt == 2:
                    raise OSError(f"the egress folders' helper is gone ({op}): {exc}") from None
            except TimeoutError:
                raise OSError(f"the egress folders' helper did not answer {op} in time") from None
        if not answer.get("ok"):
            raise OSError(f"egress folders on the engine ({op}): {answer.get('error')}")
        return answer

    async def _connected(self) -> ExecutorClient:
        """The channel to the helper, attached again if it was lost (the helper restarted)."""
        async with self._connecting:
            if self._channel is None or self._channel.lost_reason is not None:
                helper = await self._call(self._helper, self._api())
                sock = await self._call(open_attach_socket, self._api(), helper)
                self._channel = await ExecutorClient.connect(sock, self.name)
            return self._channel

    def _helper(self, api: Any) -> str:
        """The helper's id, created and started if it is not running."""
        try:
            info = api.inspect_container(self.name)
        except docker.errors.NotFound:
            info = None
        if info is not None and (
            info["HostConfig"].get("Binds") != [self._bind] or info["Config"]["Cmd"] != _COMMAND
        ):
            api.remove_container(info["Id"], force=True)  # made for another folder or program
            info = None
        if info is None:
            host = api.create_host_config(
                binds=[self._bind],
                network_mode="none",
                read_only=True,
                cap_drop=["ALL"],
                # Root in the helper only to make folders and hand them to the proxy's uid.
                cap_add=["CHOWN", "DAC_OVERRIDE", "FOWNER"],
                security_opt=["no-new-privileges"],
                mem_limit="64m",
                pids_limit=32,
                restart_policy={"Name": "unless-stopped"},
            )
            with contextlib.suppress(docker.errors.APIError):  # another made it meanwhile
                api.create_container(
                    self.image,
                    _COMMAND,
                    entrypoint=[],
                    user="0",
                    stdin_open=True,
                    labels=self.labels,
                    host_config=host,
                    name=self.name,
                )
            info = api.inspect_container(self.name)
        if not info["State"]["Running"]:
            api.start(info["Id"])
        return str(info["Id"])
