"""A task's workspace in and out, its repository checkout, and its retention after the task.

`RuntimeWorkspace.handle` answers the gateway's WorkspaceRequest (shared/workspace.py): the
bytes come and go as transfer objects in the blob store's bucket, through temporary files
here, never whole in memory nor in a NATS message. Docker's archive API reads and writes the
sandbox's /workspace whether the sandbox runs, is paused or is stopped (a keeper holds a
stopped one's tmpfs). What runs git (a checkout, an uploaded tree's baseline, a diff) runs in a
helper container (workspace_helper.py).

Retention: when a task ends (FINISHED, STOPPED, REJECTED) its sandbox is paused instead of
removed, its files kept, its seat freed, for `workspace_retention_s` (the pool keeps at most
`workspace_retained_max`, the oldest going first); then it is removed and the workspace
answers 410. A message that resumes the task within that time finds its files and sessions.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import tarfile
import tempfile
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO, Any

import docker
from redis.asyncio import Redis

from shared.events import TaskPriority
from shared.secrets_store import SecretsStore
from shared.state_store import TaskStateStore
from shared.workspace import (
    RepositoryRecords,
    RepositorySpec,
    WorkspaceOp,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
    transfer_name,
)

from .checkout import fetch, tar_git_dir
from .containers import DockerSandboxes, Sandbox, task_container_name
from .errors import ArchiveRefused, ArchiveTooLarge, CheckoutFailed, HelperTimeout
from .task_facts import TaskFacts
from .workspace_archive import (
    ChunkReader,
    check_path,
    clean_upload,
    gzip_tree,
    single_file_tar,
)
from .workspace_git import (
    checkout_script,
    diff_script,
    parse_instructions,
    upload_script,
)
from .workspace_helper import remove_stray_helpers, run_helper

__all__ = ["Retention", "RuntimeWorkspace"]

log = logging.getLogger("deckhands.runtime.workspace")

_S_IFDIR = 1 << 31  # Go's os.ModeDir, as Docker's path stat gives it
_S_IFLNK = 1 << 27  # os.ModeSymlink
_TRANSFER_SWEEP_S = 600.0  # how often transfer objects left by a crash are looked for


class _Gone(Exception):
    pass


class _NoSandbox(Exception):
    pass


class Retention:
    """Ended tasks whose sandbox is kept paused, and until when (a sorted set in Redis)."""

    def __init__(self, redis: Redis, pool_name: str) -> None:
        self.redis = redis
        self.key = f"deckhands:retained:{pool_name}"

    async def add(self, task_id: str, until: float) -> None:
        await self.redis.zadd(self.key, {task_id: until})

    async def until(self, task_id: str) -> float | None:
        score = await self.redis.zscore(self.key, task_id)
        return None if score is None else float(score)

    async def due(self, now: float) -> list[str]:
        raw = await self.redis.zrangebyscore(self.key, "-inf", now)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    async def all(self) -> list[str]:
        raw = await self.redis.zrange(self.key, 0, -1)
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]

    async def drop(self, task_id: str) -> None:
        await self.redis.zrem(self.key, task_id)

    async def oldest_beyond(self, keep: int) -> list[str]:
        """The tasks kept the longest, all but the `keep` newest (the score is the end of the
        retention, the same length for all: the oldest end first)."""
        raw = await self.redis.zrange(self.key, 0, -(keep + 1))
        return [r.decode() if isinstance(r, bytes) else str(r) for r in raw]


class RuntimeWorkspace:
    """The runtime's side of workspaces; `service` is the RuntimeService (its tasks, seats,
    bindings and task states)."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.settings = service.settings
        self.docker: DockerSandboxes = service.docker
        self.transfers: WorkspaceTransfers | None = None
        self._records: RepositoryRecords | None = None
        # The task's repository is set at its creation: read once per task, not per action.
        self._repositories: TaskFacts[tuple[RepositorySpec, str]] | None = None
        self._states: TaskStateStore | None = None
        self._secrets: SecretsStore | None = None
        self.retention: Retention | None = None
        self._transfers_swept = time.monotonic()
        # One eviction pass at a time: the releases of a crowd of ending tasks all ask for one,
        # and each would otherwise remove the same oldest sandboxes again (15 times over, seen).
        self._evicting = asyncio.Lock()
        # One checkout per task at a time (its prepare and first action may race); a lock
        # nobody holds or waits for goes away by itself.
        self._checkouts: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )

    def start(self, redis: Redis) -> None:
        self._records = RepositoryRecords(redis)
        self._repositories = TaskFacts(self._records.get)
        self._states = TaskStateStore(redis)
        self._secrets = SecretsStore.from_settings(redis, self.settings)
        self.retention = Retention(redis, self.settings.pool_name)

    @property
    def records(self) -> RepositoryRecords:
        assert self._records is not None, "RuntimeWorkspace.start() was not called"
        return self._records

    # -- the repository at task start

    async def ensure_checkout(self, task_id: str, sandbox: Sandbox) -> None:
        """Check the task's repository out into its sandbox, once, before its first action.
        CheckoutFailed says why it could not be."""
        if self._records is None:
            return
        assert self._repositories is not None
        found = await self._repositories.get(task_id)
        if found is None:
            return
        lock = self._checkouts.get(task_id)
        if lock is None:
            lock = self._checkouts[task_id] = asyncio.Lock()
        async with lock:
            done = await self.records.checked_out(task_id)
            if done is not None and done.split(":", 1)[0] == sandbox.container_id:
                return
            spec, tenant_id = found
            started = time.monotonic()
            token = await self._token(tenant_id, spec.token_secret)
            s = self.settings
            with tempfile.TemporaryDirectory(prefix="deckhands-clone-") as tmp:
                fetched = await fetch(
                    spec,
                    token,
                    Path(tmp),
                    schemes=s.repository_url_schemes,
                    timeout_s=s.repository_clone_timeout_s,
                    max_bytes=s.repository_max_bytes,
                    allowed_hosts=s.repository_allowed_hosts,
                )
                archive = Path(tmp) / "git.tar"
                await asyncio.to_thread(tar_git_dir, fetched.git_dir, archive)
                await self._put_archive(sandbox.container_id, archive)
            with tempfile.TemporaryFile() as out:
                try:
                    result = await run_helper(
                        self.docker,
                        sandbox.container_id,
                        checkout_script(s.instructions_max_bytes),
                        out=out,
                        max_out=s.instructions_max_bytes + 4096,
                        timeout_s=s.repository_clone_timeout_s,
                        writable=True,
                    )
                except HelperTimeout as exc:
                    raise CheckoutFailed(f"checking the tree out: {exc}") from None
                if result.exit_code != 0:
                    # What git said names the repository's files: the log has it, the task's
                    # reason says what failed.
                    log.warning(
                        "task %s: checking the tree out failed (exit %s): %s",
                        task_id,
                        result.exit_code,
                        " ".join(result.stderr.split())[-500:],
                    )
                    raise CheckoutFailed(
                        f"checking the repository's tree out failed (exit {result.exit_code})"
                    )
                out.seek(0)
                await self._record_instructions(task_id, out.read())
            await self.records.mark_checked_out(task_id, f"{sandbox.container_id}:{fetched.commit}")
            log.info(
                "task %s: checked out %s at %s in %.1fs",
                task_id,
                spec.url,
                fetched.commit[:12],
                time.monotonic() - started,
            )

    async def _token(self, tenant_id: str, name: str | None) -> str | None:
        if name is None:
            return None
        if self._secrets is None:
            raise CheckoutFailed(
                f"token_secret {name!r} cannot be read: secrets are off on this runtime "
                "(DECKHANDS_SECRETS_KEY)"
            )
        try:
            return await self._secrets.read(tenant_id, name)
        except LookupError:
            raise CheckoutFailed(f"the tenant has no secret {name!r} (token_secret)") from None

    async def _record_instructions(self, task_id: str, out: bytes) -> None:
        found = parse_instructions(out)
        if found is None:
            return
        path, text = found
        # They join the prompt: a secret a command wrote into the file is redacted here, at
        # the source (what the bound on the read cut through at the end, too).
        redactor = await self.service.secrets.redactor(task_id)
        cut = len(out.partition(b"\n")[2]) >= self.settings.instructions_max_bytes
        await self.records.put_instructions(task_id, path, redactor.text(text, cut_end=cut))

    # -- requests from the gateway

    async def handle(self, request: WorkspaceRequest) -> WorkspaceReply:
        s = self.settings
        # A bound on the whole request (Docker calls on threads cannot be cancelled; the answer
        # is not held back by them): a checkout, a transfer, a helper.
        deadline = s.repository_clone_timeout_s + 2 * s.workspace_helper_timeout_s + 60
        try:
            async with asyncio.timeout(deadline):
                return await self._handle(request)
        except _Gone:
            return self._gone()
        except _NoSandbox as exc:
            return WorkspaceReply(status=WorkspaceStatus.NO_SANDBOX, detail=str(exc))
        except ArchiveTooLarge as exc:
            return WorkspaceReply(status=WorkspaceStatus.TOO_LARGE, detail=str(exc))
        except ArchiveRefused as exc:
            return WorkspaceReply(status=WorkspaceStatus.BAD_REQUEST, detail=str(exc))
        except FileNotFoundError as exc:
            if await self._expired(request.task_id):
                return self._gone()  # its workspace emptied as its sandbox was removed
            return WorkspaceReply(status=WorkspaceStatus.NOT_FOUND, detail=str(exc))
        except CheckoutFailed as exc:
            return WorkspaceReply(
                status=WorkspaceStatus.UNAVAILABLE,
                detail=f"the task's repository is not checked out: {exc}",
            )
        except (docker.errors.DockerException, HelperTimeout, OSError, TimeoutError) as exc:
            if isinstance(exc, docker.errors.NotFound) and await self._expired(request.task_id):
                # Its retention ended while the request read it: Docker, removing the
                # container, answers that the path is missing (or the workspace is empty).
                return self._gone()
            # The engine's words name containers, hosts and paths of the node: they stay here.
            log.warning("workspace %s of task %s failed: %s", request.op, request.task_id, exc)
            what = "timed out" if isinstance(exc, HelperTimeout | TimeoutError) else "failed"
            return WorkspaceReply(
                status=WorkspaceStatus.UNAVAILABLE,
                detail=f"the workspace's sandbox could not be reached ({what}); try again",
            )
        except Exception:
            # Whatever else: the request gets an answer (the gateway would wait its whole
            # deadline), the detail stays in the log.
            log.exception("workspace %s of task %s failed", request.op, request.task_id)
            return WorkspaceReply(
                status=WorkspaceStatus.UNAVAILABLE,
                detail="the workspace request failed in the runtime; try again",
            )

    def _gone(self) -> WorkspaceReply:
        return WorkspaceReply(
            status=WorkspaceStatus.GONE,
            detail="the task's sandbox is gone (it ended more than "
            f"{self.settings.workspace_retention_s:g}s ago, or never had one): "
            "its workspace no longer exists",
        )

    async def _expired(self, task_id: str) -> bool:
        """Ended, and its sandbox no longer kept for its workspace."""
        return not await self.service.task_is_live(task_id) and not await self.is_retained(task_id)

    async def _handle(self, request: WorkspaceRequest) -> WorkspaceReply:
        path = check_path(request.path) if request.path is not None else None
        writes = request.op in (WorkspaceOp.PUT_TREE, WorkspaceOp.PUT_FILE)
        container_id = await self._container(request.task_id)
        with tempfile.TemporaryDirectory(prefix="deckhands-ws-") as tmp:
            work = Path(tmp)
            if writes:
                return await self._put(request, container_id, path, work)
            if request.op is WorkspaceOp.GET_TREE:
                result = work / "tree.tar.gz"
                with result.open("wb") as out:
                    size = await self.docker.call(
                        self._tree_sync, container_id, out, request.max_bytes
                    )
            elif request.op is WorkspaceOp.GET_FILE:
                if path is None:
                    raise ArchiveRefused("?path= names no file")
                result = work / "file"
                with result.open("wb") as out:
                    size = await self.docker.call(
                        self._file_sync, container_id, path, out, request.max_bytes
                    )
            else:
                result = work / "diff"
                size = await self._diff(container_id, result, request.max_bytes)
            return await self._send(request.task_id, result, size)

    async def _send(self, task_id: str, result: Path, size: int) -> WorkspaceReply:
        assert self.transfers is not None
        name = transfer_name(task_id)
        with result.open("rb") as source:
            await self.transfers.put(name, source)
        return WorkspaceReply(status=WorkspaceStatus.OK, object=name, size=size)

    async def _container(self, task_id: str) -> str:
        """The id of the task's sandbox (running or stopped); a live task without one gets
        one (if a seat is free); _Gone when there is none and will be none."""
        tasks = self.service.tasks
        local = tasks.local(task_id)
        if local is not None and not local.lost:
            return str(local.container_id)
        for ref in (await self.service.bindings.get(task_id), task_container_name(task_id)):
            if ref is None:
                continue
            info = await self.docker.inspect(ref)
            if info is not None:
                return info.id
        if not await self.service.task_is_live(task_id):
            raise _Gone
        state = await self._states.load(task_id) if self._states is not None else None
        admission = await self.service.seats.admit(
            task_id,
            tenant_id=None if state is None else state.tenant_id,
            batch=state is not None and state.priority is TaskPriority.BATCH,
        )
        if not admission.seated:
            raise _NoSandbox("every sandbox seat is taken; the task's sandbox starts later")
        egress = state is not None and state.network_egress
        if egress and not self.settings.allow_network_egress:
            raise _NoSandbox("the task asks for network egress, which this runtime refuses")
        network = self.settings.sandbox_network_name if egress else None
        workspace_mib = state.workspace_mib if state is not None else None
        sandbox = await tasks.get(
            task_id, network, self.settings.task_workspace_bytes(workspace_mib)
        )
        await self.ensure_checkout(task_id, sandbox)
        return str(sandbox.container_id)

    # -- reading

    def _stat_sync(self, container_id: str, path: str) -> dict[str, Any] | None:
        api = self.docker.api()
        response = api.head(
            api._url("/containers/{0}/archive", container_id), params={"path": path}
        )
        if response.status_code == 404:
            return None
        api._raise_for_status(response)
        header = response.headers.get("X-Docker-Container-Path-Stat", "")
        return dict(json.loads(base64.b64decode(header))) if header else {}

    def _file_sync(self, container_id: str, path: str, out: IO[bytes], max_bytes: int) -> int:
        # Every directory on the way must be one (not a symbolic link that leads elsewhere).
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            sub = "/workspace/" + "/".join(parts[:i])
            stat = self._stat_sync(container_id, sub)
            if stat is None:
                raise FileNotFoundError(f"the workspace has no {'/'.join(parts[:i])}")
            mode = int(stat.get("mode", 0))
            if mode & _S_IFLNK:
                raise ArchiveRefused(
                    f"{'/'.join(parts[:i])} is a symbolic link (to {stat.get('linkTarget')}); "
                    "name the file it points to"
                )
            if i < len(parts) and not mode & _S_IFDIR:
                raise FileNotFoundError(f"{'/'.join(parts[:i])} is not a directory")
            if i == len(parts) and mode & _S_IFDIR:
                raise ArchiveRefused(
                    f"{path} is a directory: GET .../workspace without ?path= gives the tree"
                )
            if i == len(parts) and int(stat.get("size", 0)) > max_bytes:
                raise ArchiveTooLarge(
                    f"{path} holds {stat.get('size')} bytes, more than the limit of {max_bytes}"
                )
        stream, _ = self.docker.api().get_archive(container_id, "/workspace/" + path)
        source = ChunkReader(iter(stream))
        with tarfile.open(fileobj=source, mode="r|") as tar:
            for member in tar:
                if not member.isreg():
                    raise ArchiveRefused(f"{path} is not a regular file")
                data = tar.extractfile(member)
                assert data is not None
                written = 0
                while chunk := data.read(1 << 20):
                    written += len(chunk)
                    if written > max_bytes:
                        raise ArchiveTooLarge(f"{path} is larger than {max_bytes} bytes")
                    out.write(chunk)
                return written
        raise FileNotFoundError(f"the workspace has no {path}")

    def _tree_sync(self, container_id: str, out: IO[bytes], max_bytes: int) -> int:
        stream, _ = self.docker.api().get_archive(container_id, "/workspace")
        return gzip_tree(iter(stream), out, max_bytes)

    async def _diff(self, container_id: str, result: Path, max_bytes: int) -> int:
        with result.open("wb") as out:
            outcome = await run_helper(
                self.docker,
                container_id,
                diff_script(),
                out=out,
                max_out=max_bytes,
                timeout_s=self.settings.workspace_helper_timeout_s,
            )
            size = out.tell()
        if outcome.exit_code == 3:
            raise FileNotFoundError(" ".join(outcome.stderr.split()))
        if outcome.exit_code != 0:
            raise OSError(f"git diff failed (exit {outcome.exit_code}): {outcome.stderr[-500:]}")
        if outcome.truncated:
            raise ArchiveTooLarge(f"the diff is larger than {max_bytes} bytes")
        return size

    # -- writing

    async def _put(
        self, request: WorkspaceRequest, container_id: str, path: str | None, work: Path
    ) -> WorkspaceReply:
        assert self.transfers is not None
        if request.upload is None:
            raise ArchiveRefused("the request names no upload")
        upload = work / "upload"
        with upload.open("wb") as target:
            await self.transfers.get(request.upload, target)
        clean = work / "clean.tar"
        s = self.settings
        if request.op is WorkspaceOp.PUT_FILE:
            if path is None:
                raise ArchiveRefused("?path= names no file")
            size = upload.stat().st_size
            with upload.open("rb") as source, clean.open("wb") as out:
                await asyncio.to_thread(single_file_tar, path, source, size, out)
            files = 1
        else:
            with upload.open("rb") as source, clean.open("wb") as out:
                files = await asyncio.to_thread(
                    lambda: clean_upload(
                        source,
                        request.archive or "tar",
                        out,
                        max_bytes=s.workspace_max_extract_bytes,
                        max_files=s.workspace_max_files,
                        base=path,
                    )
                )
        upload.unlink()
        await self._put_archive(container_id, clean)
        with tempfile.TemporaryFile() as out_file:
            outcome = await run_helper(
                self.docker,
                container_id,
                upload_script(s.instructions_max_bytes),
                out=out_file,
                max_out=s.instructions_max_bytes + 4096,
                timeout_s=s.workspace_helper_timeout_s,
                writable=True,
            )
            if outcome.exit_code != 0:
                log.warning(
                    "task %s: the uploaded tree's baseline failed: %s",
                    request.task_id,
                    outcome.stderr[-300:],
                )
            out_file.seek(0)
            await self._record_instructions(request.task_id, out_file.read())
        return WorkspaceReply(status=WorkspaceStatus.OK, files=files)

    async def _put_archive(self, container_id: str, archive: Path) -> None:
        def put() -> None:
            with archive.open("rb") as data:
                if not self.docker.api().put_archive(container_id, "/workspace", data):
                    raise OSError("Docker did not accept the archive")

        await self.docker.call(put)

    # -- retention of ended tasks' sandboxes

    async def retain(self, task_id: str) -> bool:
        """The task ended: keep its sandbox paused for the retention time. False if it is
        not kept (no retention, or no sandbox here to keep): the caller removes it."""
        s = self.settings
        if s.workspace_retention_s <= 0 or self.retention is None:
            return False
        # Recorded before the stop: reconciliation removes a stopped sandbox of an ended task
        # that is not kept.
        await self.retention.add(task_id, time.time() + s.workspace_retention_s)
        if not await self.service.tasks.retain(task_id):
            await self.retention.drop(task_id)
            return False
        log.info("task %s: sandbox kept paused for %.0fs", task_id, s.workspace_retention_s)
        return True

    async def is_retained(self, task_id: str) -> bool:
        if self.retention is None:
            return False
        until = await self.retention.until(task_id)
        return until is not None and until > time.time()

    async def evict_beyond_cap(self, is_over: Callable[[str], Awaitable[bool]]) -> int:
        """Remove the oldest kept sandboxes while the pool keeps more than
        `workspace_retained_max` (those on another live replica's engine are that replica's to
        remove: its own release or sweep does)."""
        if self.retention is None:
            return 0
        cap = self.settings.workspace_retained_max
        evicted = 0
        async with self._evicting:
            for task_id in await self.retention.oldest_beyond(cap):
                if await self._end_retention(task_id, is_over):
                    evicted += 1
                    log.info(
                        "task %s: its kept sandbox is removed before its retention ends: the "
                        "pool keeps at most %d (DECKHANDS_WORKSPACE_RETAINED_MAX)",
                        task_id,
                        cap,
                    )
        return evicted

    async def _end_retention(
        self, task_id: str, ended: Callable[[str], Awaitable[bool]]
    ) -> bool | None:
        """The task's sandbox is no longer kept: removed if its task `ended` (True), or left to
        its own life if it runs again (False). None: it is on another live replica's engine,
        whose release or sweep does it."""
        if self.retention is None or await self.service.tasks.held_elsewhere(task_id) is not None:
            return None
        removed = await ended(task_id)
        if removed:
            await self.service.tasks.release(task_id)
        await self.retention.drop(task_id)
        return removed

    async def sweep(
        self, is_over: Callable[[str], Awaitable[bool]], is_gone: Callable[[str], Awaitable[bool]]
    ) -> int:
        """Remove the kept sandboxes whose time is up or whose task was deleted, and the oldest
        beyond the pool's cap."""
        if self.retention is None:
            return 0
        removed = await self.evict_beyond_cap(is_over)
        due = set(await self.retention.due(time.time()))

        async def ended(task_id: str) -> bool:
            return await is_over(task_id) or await is_gone(task_id)

        for task_id in await self.retention.all():
            if task_id not in due and not await is_gone(task_id):
                continue
            if await self._end_retention(task_id, ended):
                removed += 1
        # Helpers a crash left behind (each has a deadline well below this age).
        s = self.settings
        oldest = 2 * max(s.workspace_helper_timeout_s, s.repository_clone_timeout_s) + 60
        await self.docker.call(remove_stray_helpers, self.docker, oldest)
        now = time.monotonic()
        if self.transfers is not None and now - self._transfers_swept > _TRANSFER_SWEEP_S:
            self._transfers_swept = now
            try:
                await self.transfers.remove_stale(3600.0)
            except Exception as exc:  # the blob store may be busy: next time
                log.warning("stale workspace transfers not removed: %s", exc)
        return removed
