"""A task's workspace in and out: the gateway asks the runtime, the bytes travel as objects.

The gateway sends a WorkspaceRequest to WORKSPACE_SUBJECT (core NATS request/reply, one runtime
replica answers: queue group `runtime`) and gets a WorkspaceReply. What moves (an upload, a
tree, a file, a diff) never travels in a NATS message (1 MiB at most): it is a transfer object
in the blob store's bucket, named `<task id>/workspace-<random>`, streamed in and out of a
temporary file on each side, and deleted by the gateway once served (or consumed).

Also the repository a task starts from (RepositorySpec), recorded in Redis by the gateway at
creation and read by the runtime when it gives the task its first sandbox.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import IO, Literal
from urllib.parse import urlsplit

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore
from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis

from .subjects import BLOBS_BUCKET

__all__ = [
    "WORKSPACE_SUBJECT",
    "RepositoryRecords",
    "RepositorySpec",
    "WorkspaceOp",
    "WorkspaceReply",
    "WorkspaceRequest",
    "WorkspaceStatus",
    "WorkspaceTransfers",
    "bad_ref",
    "bad_repository_url",
    "transfer_name",
]

WORKSPACE_SUBJECT = "deckhands.runtime.workspace"


class WorkspaceOp(StrEnum):
    GET_TREE = "get_tree"  # the whole /workspace as a tar.gz
    GET_FILE = "get_file"  # one regular file
    PUT_TREE = "put_tree"  # a tar (any compression) or zip extracted into /workspace
    PUT_FILE = "put_file"  # one file written at `path`
    DIFF = "diff"  # git diff against the start commit, or against the uploaded tree


class WorkspaceStatus(StrEnum):
    OK = "ok"
    GONE = "gone"  # the task's sandbox was removed (410)
    NO_SANDBOX = "no_sandbox"  # not yet: no seat free for it now (503)
    BAD_REQUEST = "bad_request"  # a path outside /workspace, a bad archive (400)
    NOT_FOUND = "not_found"  # no such file in the workspace (404)
    TOO_LARGE = "too_large"  # past a size limit (413)
    UNAVAILABLE = "unavailable"  # Docker or the blob store failed (503)


class WorkspaceRequest(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    op: WorkspaceOp
    task_id: str
    path: str | None = Field(default=None, description="A path relative to /workspace.")
    upload: str | None = Field(
        default=None, description="PUT: the transfer object holding the uploaded bytes."
    )
    archive: Literal["tar", "zip"] | None = Field(default=None, description="PUT_TREE: format.")
    max_bytes: int = Field(ge=1, description="The most the answer may hold (bytes).")


class WorkspaceReply(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    status: WorkspaceStatus
    detail: str = ""
    object: str | None = Field(default=None, description="The transfer object of the answer.")
    size: int = 0
    files: int = Field(default=0, description="PUT: files written.")


def transfer_name(task_id: str) -> str:
    return f"{task_id}/workspace-{secrets.token_hex(12)}"


class WorkspaceTransfers:
    """Streams transfer objects between a local file and the blob store's bucket: chunks of
    128 KiB go through NATS, never the whole object in memory."""

    def __init__(self, jetstream: Callable[[], JetStreamContext], timeout_s: float = 300.0):
        self._jetstream = jetstream
        self.timeout_s = timeout_s
        self._store: ObjectStore | None = None

    async def _bucket(self) -> ObjectStore:
        if self._store is None:
            self._store = await self._jetstream().object_store(BLOBS_BUCKET)
        return self._store

    async def put(self, name: str, source: IO[bytes]) -> int:
        store = await self._bucket()
        info = await asyncio.wait_for(store.put(name, source), self.timeout_s)  # type: ignore[arg-type]
        return int(info.size or 0)

    async def get(self, name: str, target: IO[bytes]) -> None:
        """Write the object into `target`; LookupError when there is none."""
        store = await self._bucket()
        try:
            await asyncio.wait_for(store.get(name, writeinto=target), self.timeout_s)  # type: ignore[arg-type]
        except (ObjectNotFoundError, NotFoundError):
            raise LookupError(f"no transfer object {name}") from None

    async def delete(self, name: str) -> None:
        store = await self._bucket()
        try:
            await asyncio.wait_for(store.delete(name), 30.0)
        except (ObjectNotFoundError, NotFoundError):
            pass

    async def remove_stale(self, older_than_s: float) -> int:
        """Transfer objects a gateway or runtime that died mid-way left behind (every transfer
        finishes within the request deadlines, far below `older_than_s`): deleted."""
        store = await self._bucket()
        try:
            infos = await asyncio.wait_for(store.list(ignore_deletes=True), 60.0)
        except NotFoundError:
            return 0
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than_s)
        removed = 0
        for info in infos:
            name = info.name or ""
            if "/workspace-" not in name or not info.mtime:
                continue
            try:
                made = datetime.fromisoformat(info.mtime.replace("Z", "+00:00"))
            except ValueError:
                continue
            if made.tzinfo is None:
                made = made.replace(tzinfo=UTC)
            if made < cutoff:
                await self.delete(name)
                removed += 1
        return removed


class RepositorySpec(BaseModel):
    """The repository a task's workspace starts from (POST /v1/tasks `repository`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str = Field(
        min_length=1,
        max_length=2048,
        description="https://, http:// or git:// URL of a git repository (the schemes the "
        "operator allows, DECKHANDS_REPOSITORY_URL_SCHEMES).",
    )
    ref: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="A branch, tag or commit id; the remote's default branch if absent.",
    )
    token_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="The name of the tenant's secret holding an access token for the URL.",
    )


_REF = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/@+-]{0,254}$")


def bad_repository_url(url: str, schemes: list[str]) -> str | None:
    """Why `url` cannot be a task's repository here (the gateway: 422; the runtime: the
    task ends in ERROR), or None."""
    if any(ord(c) < 33 for c in url):
        return "the URL holds spaces or control characters"
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"the URL cannot be parsed: {exc}"
    if parts.scheme not in schemes:
        return (
            f"the URL's scheme must be one of {', '.join(schemes)} "
            "(DECKHANDS_REPOSITORY_URL_SCHEMES)"
        )
    if not parts.hostname:
        return "the URL names no host"
    if parts.username or parts.password:
        return (
            "the URL must not hold credentials: put a token in a secret "
            "(PUT /v1/secrets/{name}) and name it in token_secret"
        )
    return None


def bad_ref(ref: str) -> str | None:
    if (
        not re.match(r"^[A-Za-z0-9][A-Za-z0-9._/@+-]{0,254}$", ref)
        or ".." in ref
        or ref.endswith((".lock", "/", "."))
        or "@{" in ref
    ):
        return "ref must be a branch, tag or commit name (letters, digits, ._/@+-)"
    return None


_KEY = "deckhands:repository:{}"
_DONE_KEY = "deckhands:repository-checked-out:{}"
_INSTRUCTIONS_KEY = "deckhands:instructions:{}"


class RepositoryRecords:
    """Redis: the repository of each task, whether it was checked out (and at which commit),
    and the repository instructions (AGENTS.md) its workspace holds."""

    def __init__(self, redis: Redis, ttl_s: int = 30 * 86400) -> None:
        self.redis = redis
        self.ttl_s = ttl_s

    async def put(self, task_id: str, spec: RepositorySpec, tenant_id: str) -> None:
        value = json.dumps({"spec": spec.model_dump(), "tenant_id": tenant_id})
        await self.redis.set(_KEY.format(task_id), value, ex=self.ttl_s)

    async def get(self, task_id: str) -> tuple[RepositorySpec, str] | None:
        """The task's repository and its tenant (whose secret holds the token), if any."""
        raw = await self.redis.get(_KEY.format(task_id))
        if raw is None:
            return None
        value = json.loads(raw)
        return RepositorySpec.model_validate(value["spec"]), str(value["tenant_id"])

    async def checked_out(self, task_id: str) -> str | None:
        raw = await self.redis.get(_DONE_KEY.format(task_id))
        return None if raw is None else (raw.decode() if isinstance(raw, bytes) else str(raw))

    async def mark_checked_out(self, task_id: str, commit: str) -> None:
        await self.redis.set(_DONE_KEY.format(task_id), commit, ex=self.ttl_s)

    async def put_instructions(self, task_id: str, path: str, text: str) -> None:
        value = json.dumps({"path": path, "text": text})
        await self.redis.set(_INSTRUCTIONS_KEY.format(task_id), value, ex=self.ttl_s)

    async def clear_instructions(self, task_id: str) -> None:
        await self.redis.delete(_INSTRUCTIONS_KEY.format(task_id))

    async def instructions(self, task_id: str) -> tuple[str, str] | None:
        """(path, text) of the workspace's repository instructions, if it has any."""
        raw = await self.redis.get(_INSTRUCTIONS_KEY.format(task_id))
        if raw is None:
            return None
        value = json.loads(raw)
        return str(value["path"]), str(value["text"])

    async def forget_repository(self, task_id: str) -> None:
        """A deleted task's repository (the gateway's record)."""
        await self.redis.delete(_KEY.format(task_id))

    async def forget_checkout(self, task_id: str) -> None:
        """What a deleted task's checkout left (the runtime's records)."""
        await self.redis.delete(_DONE_KEY.format(task_id), _INSTRUCTIONS_KEY.format(task_id))
