"""Sandbox containers on the Docker engine: hardened creation, attach, rename, listing, removal.

docker-py is blocking, so every call runs on a thread of this module's own pool and the event
loop never waits on Docker. Containers carry labels (labels cannot change after creation) and a
name that does: `deckhands-idle-<random>` while in the pool, `deckhands-task-<task>` once bound
to a task (sandbox_labels.py).

Its parts: the labels and names (sandbox_labels.py), the hardened host config
(sandbox_host_config.py), the start-up check of the engine (engine_check.py), removal
(container_removal.py), and the records it hands out (sandbox.py, container_info.py), whose
names are importable from here too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
from docker.errors import APIError, NotFound

from shared.sandbox_protocol import PROTOCOL_VERSION

from .container_info import ContainerInfo, container_info
from .container_removal import remove_container
from .egress_folders import egress_folders
from .engine_check import check_engine
from .errors import ExecutorError, SandboxLost, SandboxStartError
from .executor_client import ExecutorClient, open_attach_socket
from .keepers import ROLE_KEEPER, remove_keeper, remove_stray_keepers, start_keeper
from .sandbox import Sandbox
from .sandbox_host_config import sandbox_container_config, sandbox_host_config
from .sandbox_labels import (
    IDLE_PREFIX,
    LABEL_NETWORK,
    LABEL_POOL,
    LABEL_REPLICA,
    LABEL_ROLE,
    NO_NETWORK,
    ROLE_SANDBOX,
    TASK_PREFIX,
    sandbox_labels,
    task_container_name,
)
from .sandbox_shape import POOL_SHAPE, SandboxShape
from .settings import RuntimeSettings

__all__ = [
    "IDLE_PREFIX",
    "LABEL_NETWORK",
    "LABEL_POOL",
    "LABEL_REPLICA",
    "LABEL_ROLE",
    "NO_NETWORK",
    "ROLE_SANDBOX",
    "TASK_PREFIX",
    "ContainerInfo",
    "DockerSandboxes",
    "Sandbox",
    "task_container_name",
]

log = logging.getLogger("deckhands.runtime.containers")

T = TypeVar("T")


class DockerSandboxes:
    """Creates and manages this pool's sandbox containers."""

    def __init__(
        self, settings: RuntimeSettings, replica_id: str, client: docker.DockerClient | None = None
    ) -> None:
        self.settings = settings
        self.replica_id = replica_id
        self._client = client
        # Containers being created right now: reconciliation must not mistake them for leaks.
        self.pending_names: set[str] = set()
        self.egress_folders = egress_folders(settings, self._call, self._api, replica_id)
        # The egress folder of each sandbox created here that has one (removed with it).
        self.egress_tokens: dict[str, str] = {}
        # Creations whose caller gave up: their containers are removed as soon as they exist.
        self._abandoned: set[asyncio.Future[Any]] = set()
        # Docker calls block: they run on threads of our own, as many as a burst of sandbox
        # starts needs (the default executor has only a few), never on the event loop.
        self._threads = ThreadPoolExecutor(
            max_workers=settings.docker_threads, thread_name_prefix="docker"
        )

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, functools.partial(fn, *args))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking Docker function on this pool's threads (workspace transfers)."""
        return await self._call(fn, *args)

    def api(self) -> Any:
        """docker-py's low-level client (blocking: call it on `call`'s threads)."""
        return self._api()

    # -- connection

    def _api(self) -> Any:
        if self._client is None:
            self._client = docker.from_env(timeout=60, max_pool_size=self.settings.docker_threads)
        return self._client.api

    async def check(self) -> None:
        """Fail start-up with a clear message when Docker or the image is missing."""
        try:
            await self._call(lambda: check_engine(self._api(), self.settings))
        except docker.errors.DockerException as exc:
            raise SandboxStartError(f"cannot reach the Docker engine: {exc}") from exc
        if self.settings.workspace_bytes is None:
            log.warning(
                "sandbox_workspace=volume: /workspace has no size limit, one sandbox can fill "
                "the engine's disk (sandbox_workspace=tmpfs sets a quota)"
            )

    # -- creation

    @property
    def pool_network(self) -> str:
        """The network of warm sandboxes: none, unless egress is on for the whole runtime."""
        s = self.settings
        return s.sandbox_network_name if s.sandbox_network else NO_NETWORK

    def labels(self, network: str, egress_token: str | None = None) -> dict[str, str]:
        s = self.settings
        return sandbox_labels(s.pool_name, self.replica_id, s.sandbox_image, network, egress_token)

    def host_config(
        self, network: str | None = None, workspace_bytes: int | None = None
    ) -> dict[str, Any]:
        """The hardening every sandbox gets (sandbox_host_config.py). `workspace_bytes`:
        a task's own /workspace quota instead of the default."""
        return sandbox_host_config(self.settings, network or self.pool_network, workspace_bytes)

    async def create(self, shape: SandboxShape = POOL_SHAPE) -> Sandbox:
        """Create, start and attach a fresh sandbox; it is ready once its executor answers.

        `shape` (sandbox_shape.py): a Docker network for a task that opted in to plain egress
        (by default the pool's: none), a task's own /workspace quota, or a network policy: no
        network, and a folder for the egress proxy (egress_folders.py).
        """
        name = IDLE_PREFIX + secrets.token_hex(6)
        workspace_bytes = shape.workspace_bytes
        egress_token = folder = None
        environment = {"DECKHANDS_WORKSPACE": "/workspace"}
        if shape.egress is not None:
            network = NO_NETWORK
            egress_token, folder = await self.egress_folders.make(shape.egress)
            environment |= self.egress_folders.environment()
        else:
            network = shape.network or self.pool_network

        def _create() -> str:
            api = self._api()
            config = sandbox_container_config(
                api,
                self.settings,
                self.labels(network, egress_token),
                environment,
                sandbox_host_config(self.settings, network, workspace_bytes, folder),
            )
            container = api.create_container_from_config(config, name)
            cid = str(container["Id"])
            try:
                api.start(cid)
            except Exception:
                self._remove_sync(cid)
                raise
            return cid

        self.pending_names.add(name)
        try:
            creation = asyncio.ensure_future(self._call(_create))
            try:
                # Shielded: a cancelled caller must not leave the thread's container behind.
                cid = await asyncio.shield(creation)
            except asyncio.CancelledError:
                self._abandon(creation)
                raise
            except docker.errors.DockerException as exc:
                await self.egress_folders.remove(egress_token)
                raise SandboxStartError(f"cannot create a sandbox: {exc}") from exc
            except BaseException:
                await self.egress_folders.remove(egress_token)
                raise
            if egress_token is not None:
                self.egress_tokens[cid] = egress_token
            try:
                sandbox = await self.attach(cid, name, timeout_s=self.settings.start_timeout_s)
                sandbox.network = network
                sandbox.workspace_bytes = workspace_bytes
                sandbox.egress, sandbox.egress_token = shape.egress, egress_token
                return sandbox
            except BaseException:
                await self.remove(cid)
                raise
        finally:
            self.pending_names.discard(name)

    def _abandon(self, creation: asyncio.Future[str]) -> None:
        async def remove_when_created() -> None:
            with contextlib.suppress(BaseException):
                cid = await creation
                await self._call(self._remove_sync, cid)

        removal = asyncio.ensure_future(remove_when_created())
        self._abandoned.add(removal)
        removal.add_done_callback(self._abandoned.discard)

    async def drain(self, timeout_s: float) -> None:
        """Wait until abandoned creations are removed, so shutting down leaves none behind."""
        if self._abandoned:
            await asyncio.wait(set(self._abandoned), timeout=timeout_s)

    async def attach(self, container_id: str, name: str, timeout_s: float = 5.0) -> Sandbox:
        """Attach to a running sandbox and wait until its executor answers a ping in our
        protocol (an executor of another version is refused: its image is of other sources)."""
        try:
            sock = await self._call(lambda: open_attach_socket(self._api(), container_id))
        except docker.errors.DockerException as exc:
            raise SandboxStartError(f"cannot attach to {container_id[:12]}: {exc}") from exc
        client = await ExecutorClient.connect(sock, name)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                pong = await client.ping(min(1.0, max(0.05, deadline - time.monotonic())))
                break
            except (TimeoutError, SandboxLost, ExecutorError) as exc:
                if client.lost_reason is not None or time.monotonic() >= deadline:
                    await client.close()
                    raise SandboxStartError(
                        f"the executor in {container_id[:12]} did not answer: {exc}"
                    ) from exc
        if pong["protocol"] != PROTOCOL_VERSION:
            await client.close()
            raise SandboxStartError(
                f"the executor in {container_id[:12]} speaks sandbox protocol "
                f"{pong['protocol']}, this runtime {PROTOCOL_VERSION}: its image "
                f"({self.settings.sandbox_image}) was built from other sources: rebuild it "
                "(make image)"
            )
        return Sandbox(container_id=container_id, name=name, session=client)

    # -- changes

    async def rename(self, container_id: str, name: str) -> None:
        """Rename, first removing a leftover container that holds the name (e.g. a dead one)."""

        def _rename() -> None:
            api = self._api()
            try:
                api.rename(container_id, name)
            except APIError as exc:
                if exc.status_code != 409:
                    raise
                try:
                    holder = api.inspect_container(name)
                except NotFound:
                    holder = None
                if holder is not None and holder["Id"] != container_id:
                    log.warning("removing %s (%s) which held the name", name, holder["Id"][:12])
                    self._remove_sync(holder["Id"])
                api.rename(container_id, name)

        await self._call(_rename)

    async def stop(self, container_id: str, timeout_s: int = 5) -> None:
        """Stop the container (SIGTERM, then SIGKILL after `timeout_s`); its volume stays."""
        await self._call(lambda: self._api().stop(container_id, timeout=timeout_s))

    async def start(self, container_id: str) -> None:
        await self._call(lambda: self._api().start(container_id))

    async def pause(self, container_id: str) -> None:
        """Freeze every process of the container (the cgroup freezer): tens of milliseconds,
        where a stop and a keeper (keep_workspace) are a container start and a stop."""
        await self._call(lambda: self._api().pause(container_id))

    async def unpause(self, container_id: str) -> None:
        await self._call(lambda: self._api().unpause(container_id))

    def _remove_sync(self, container_id: str) -> None:
        keeper = self.settings.workspace_bytes is not None
        remove_container(self._api(), container_id, keeper=keeper)

    async def remove(self, container_id: str) -> None:
        try:
            await self._call(self._remove_sync, container_id)
        except docker.errors.DockerException as exc:
            log.warning("could not remove sandbox %s: %s", container_id[:12], exc)
            return
        # Its egress folder, if it had one (one left by a crash: `sweep_egress_folders`).
        await self.egress_folders.remove(self.egress_tokens.pop(container_id, None))

    # -- workspace keepers (keepers.py): a tmpfs workspace's files across a stop

    async def keep_workspace(self, container_id: str) -> None:
        """Before a sandbox with a tmpfs workspace stops: hold its volume mounted."""
        if self.settings.workspace_bytes is None:
            return  # on disk, the volume keeps its files anyway
        labels = {LABEL_ROLE: ROLE_KEEPER, LABEL_POOL: self.settings.pool_name}
        await self._call(start_keeper, self._api(), self.settings, labels, container_id)

    async def release_workspace(self, container_id: str) -> None:
        """Once the sandbox runs again: its keeper is no longer needed."""
        if self.settings.workspace_bytes is None:
            return
        try:
            await self._call(remove_keeper, self._api(), container_id)
        except docker.errors.DockerException as exc:  # reconciliation removes it later
            log.warning("could not remove the keeper of %s: %s", container_id[:12], exc)

    async def remove_stray_keepers(self) -> int:
        """Keepers whose sandbox is gone or running again (a crash between two steps)."""
        filters = [f"{LABEL_ROLE}={ROLE_KEEPER}", f"{LABEL_POOL}={self.settings.pool_name}"]
        try:
            return await self._call(
                remove_stray_keepers, self._api(), filters, self.settings.start_timeout_s * 2
            )
        except docker.errors.DockerException as exc:
            log.warning("could not remove stray workspace keepers: %s", exc)
            return 0

    # -- queries

    async def list(self, *, everything: bool = True) -> list[ContainerInfo]:
        """This pool's sandbox containers (all states when `everything`)."""

        def _list() -> list[ContainerInfo]:
            raw = self._api().containers(
                all=everything,
                filters={
                    "label": [
                        f"{LABEL_ROLE}={ROLE_SANDBOX}",
                        f"{LABEL_POOL}={self.settings.pool_name}",
                    ]
                },
            )
            return [container_info(c) for c in raw]

        return await self._call(_list)

    async def inspect(self, ref: str) -> ContainerInfo | None:
        """A container by id or name, or None when there is none."""

        def _inspect() -> ContainerInfo | None:
            try:
                return container_info(self._api().inspect_container(ref))
            except NotFound:
                return None

        return await self._call(_inspect)

    async def prune_volumes(self) -> int:
        """Remove this pool's workspace volumes that no container uses (left by a crash)."""

        def _prune() -> int:
            result = self._api().prune_volumes(
                filters={
                    "label": [
                        f"{LABEL_ROLE}={ROLE_SANDBOX}",
                        f"{LABEL_POOL}={self.settings.pool_name}",
                    ]
                }
            )
            return len(result.get("VolumesDeleted") or [])

        try:
            return await self._call(_prune)
        except docker.errors.DockerException as exc:
            log.warning("could not prune workspace volumes: %s", exc)
            return 0

    async def stats_memory(self, container_id: str) -> int:
        """Current memory use of a container in bytes (for the benchmark)."""

        def _stats() -> int:
            stats = self._api().stats(container_id, stream=False)
            return int((stats.get("memory_stats") or {}).get("usage") or 0)

        return await self._call(_stats)

    def close(self) -> None:
        self._threads.shutdown(wait=False)
        if self._client is not None:
            self._client.close()
