"""A task's workspace in and out: the gateway's workspace requests.

`RuntimeWorkspace.handle` answers the gateway's WorkspaceRequest (shared/workspace.py): the
bytes come and go as transfer objects in the blob store's bucket, through temporary files
here, never whole in memory nor in a NATS message. Docker's archive API reads and writes the
sandbox's /workspace whether the sandbox runs, is paused or is stopped (workspace_files.py).
What runs git (a checkout, an uploaded tree's baseline, a diff) runs in a helper container
(workspace_helper.py). A task that ended keeps its workspace for a while (retention.py).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
from pathlib import Path

import docker

from shared.admission import SandboxSeats
from shared.events import EventSource, TaskPriority, WorkspaceUploadedObservation
from shared.workspace import (
    WorkspaceOp,
    WorkspaceReply,
    WorkspaceRequest,
    WorkspaceStatus,
    WorkspaceTransfers,
    transfer_name,
)

from .bindings import TaskBindings
from .containers import DockerSandboxes, task_container_name
from .errors import ArchiveRefused, ArchiveTooLarge, CheckoutFailed, HelperTimeout
from .repository_checkout import RepositoryCheckout
from .retention import KeptSandboxes
from .sandbox_shape import POOL_SHAPE, shape_for
from .seating import Publish
from .settings import RuntimeSettings
from .task_sandboxes import TaskSandboxes
from .task_status import TaskStatus
from .workspace_archive import check_path, clean_upload, single_file_tar
from .workspace_files import diff, file_sync, put_archive, tree_sync
from .workspace_git import upload_script
from .workspace_helper import remove_stray_helpers, run_helper

__all__ = ["RuntimeWorkspace"]

log = logging.getLogger("deckhands.runtime.workspace")

_TRANSFER_SWEEP_S = 600.0  # how often transfer objects left by a crash are looked for


class _Gone(Exception):
    pass


class _NoSandbox(Exception):
    pass


class RuntimeWorkspace:
    """The runtime's side of workspaces: a task's files read and written, its sandbox found
    (or started, if a seat is free) for that."""

    def __init__(
        self,
        settings: RuntimeSettings,
        docker: DockerSandboxes,
        tasks: TaskSandboxes,
        bindings: TaskBindings,
        seats: SandboxSeats,
        status: TaskStatus,
        kept: KeptSandboxes,
        checkouts: RepositoryCheckout,
        transfers: WorkspaceTransfers | None = None,
        publish: Publish | None = None,
    ) -> None:
        self.settings = settings
        self.docker = docker
        self.tasks = tasks
        self.bindings = bindings
        self.seats = seats
        self.status = status
        self.kept = kept
        self.checkouts = checkouts
        self.transfers = transfers
        self.publish = publish  # an upload's entry, to the task's log (its checkpoint follows)
        self._transfers_swept = time.monotonic()

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
        if await self.status.is_live(task_id) or await self.kept.is_retained(task_id):
            return False
        # A task's end and the record of its retention are two steps (the release follows the
        # end): a task still bound to its sandbox in between is not gone, and what the sandbox
        # answered holds. A removal unbinds first, so a sandbox being removed is gone.
        return await self.bindings.get(task_id) is None

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
                        tree_sync, self.docker, container_id, out, request.max_bytes
                    )
            elif request.op is WorkspaceOp.GET_FILE:
                if path is None:
                    raise ArchiveRefused("?path= names no file")
                result = work / "file"
                with result.open("wb") as out:
                    size = await self.docker.call(
                        file_sync, self.docker, container_id, path, out, request.max_bytes
                    )
            else:
                result = work / "diff"
                size = await diff(
                    self.docker,
                    container_id,
                    result,
                    request.max_bytes,
                    self.settings.workspace_helper_timeout_s,
                )
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
        tasks = self.tasks
        local = tasks.local(task_id)
        if local is not None and not local.lost:
            return str(local.container_id)
        for ref in (await self.bindings.get(task_id), task_container_name(task_id)):
            if ref is None:
                continue
            info = await self.docker.inspect(ref)
            if info is not None:
                return info.id
        if not await self.status.is_live(task_id):
            raise _Gone
        state = await self.status.state(task_id)
        admission = await self.seats.admit(
            task_id,
            tenant_id=None if state is None else state.tenant_id,
            batch=state is not None and state.priority is TaskPriority.BATCH,
        )
        if not admission.seated:
            raise _NoSandbox("every sandbox seat is taken; the task's sandbox starts later")
        egress = state is not None and state.network_egress
        if egress and not self.settings.allow_network_egress:
            raise _NoSandbox("the task asks for network egress, which this runtime refuses")
        shape = POOL_SHAPE
        if state is not None:
            shape = shape_for(
                self.settings,
                task_id,
                tenant_id=state.tenant_id,
                network_egress=egress,
                network=state.network,
                workspace_mib=state.workspace_mib,
            )
        sandbox = await tasks.get(task_id, shape)
        await self.checkouts.ensure(task_id, sandbox)
        return str(sandbox.container_id)

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
        await put_archive(self.docker, container_id, clean)
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
            await self.checkouts.record_instructions(request.task_id, out_file.read())
        if self.publish is not None:
            # Logged, so that a fork or a rewind from here on has these files: the controller
            # asks for their checkpoint at this entry's seq.
            await self.publish(
                WorkspaceUploadedObservation(
                    task_id=request.task_id,
                    source=EventSource.USER,
                    path=path or "",
                    files=files,
                    format="file"
                    if request.op is WorkspaceOp.PUT_FILE
                    else (request.archive or "tar"),
                )
            )
        return WorkspaceReply(status=WorkspaceStatus.OK, files=files)

    # -- what a crash left behind

    async def remove_leftovers(self) -> None:
        """Remove the helpers and the transfer objects that requests cut short left behind."""
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
