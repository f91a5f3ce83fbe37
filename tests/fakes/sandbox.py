"""An in-process SandboxSession (SWE-ReX's dummy runtime, for our contract): the runtime's
logic above the sandbox boundary is tested with it, without Docker.

Files live in a dict, a command's answer comes from `commands` (a function of the request;
longer than the request's limit, it is cut and kept whole for `chunk` in 4-byte pieces),
and every request is recorded, so a test can say what ran and how often. `lose()` ends the
session as a removed container would: the call in flight and every later one raise SandboxLost.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import posixpath
from collections.abc import Callable
from typing import Any

from shared.sandbox_protocol import PROTOCOL_VERSION
from shared.sandbox_protocol.messages import (
    BashReply,
    BashRequest,
    ChunkReply,
    ChunkRequest,
    CommitReply,
    CommitRequest,
    EditReply,
    EditRequest,
    PackReply,
    PackRequest,
    PingReply,
    PythonReply,
    PythonRequest,
    ReadReply,
    ReadRequest,
    ScanEntry,
    ScanReply,
    ScanRequest,
    WriteReply,
    WriteRequest,
)
from shared.sandbox_protocol.session import ExecutorError, SandboxLost

__all__ = ["FakeSandbox", "ran"]

WORKSPACE = "/workspace"


def ran(request: BashRequest) -> tuple[str, int]:
    """The default answer to a command: it ran, and said so."""
    return f"ran: {request['command']}\n", 0


class FakeSandbox:
    """A SandboxSession held in memory (see the module docstring)."""

    def __init__(
        self,
        name: str = "fake-sandbox",
        commands: Callable[[BashRequest], tuple[str, int]] = ran,
        delay_s: float = 0.0,
        protocol: int = PROTOCOL_VERSION,
    ) -> None:
        self.name = name
        self.commands = commands
        self.delay_s = delay_s  # how long every call takes
        self.protocol = protocol
        self.files: dict[str, str] = {}
        self.kept: dict[str, str] = {}  # whole outputs, by name, for `chunk`
        self.requests: list[tuple[str, dict[str, Any]]] = []
        # Checkpoints: the files as last committed, and a scan waiting for its commit.
        self.committed: dict[str, ScanEntry] = {}
        self.pending: dict[str, ScanEntry] | None = None
        self.lost_reason: str | None = None
        self.violated = False
        self._lost = asyncio.Event()

    def ops(self, op: str) -> list[dict[str, Any]]:
        """The requests of one operation, in the order they came."""
        return [fields for name, fields in self.requests if name == op]

    def lose(self, reason: str = "the container was removed") -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
        self._lost.set()

    async def close(self) -> None:
        self.lose("closed by the runtime")

    async def _arrive(self, op: str, request: Any, wait_s: float) -> None:
        """Record the request and take `delay_s` of the caller's `wait_s`, as a sandbox would."""
        if self.lost_reason is not None:
            raise SandboxLost(self.lost_reason)
        self.requests.append((op, dict(request)))
        async with asyncio.timeout(wait_s):
            lost = asyncio.ensure_future(self._lost.wait())
            try:
                await asyncio.wait({lost}, timeout=self.delay_s)
            finally:
                lost.cancel()
        if self.lost_reason is not None:
            raise SandboxLost(self.lost_reason)

    # -- the contract

    async def ping(self, wait_s: float) -> PingReply:
        await self._arrive("ping", {}, wait_s)
        return {"ok": True, "pid": 1, "protocol": self.protocol}

    async def bash(self, request: BashRequest, wait_s: float) -> BashReply:
        await self._arrive("bash", request, wait_s)
        output, code = self.commands(request)
        reply: BashReply = {
            "ok": True,
            "output": output,
            "exit_code": code,
            "cwd": WORKSPACE,
            "timed_out": False,
            "running": False,
            "note": "",
        }
        limit = request.get("limit", 30_000)
        if len(output) > limit:  # cut, and kept whole when asked, as the executor does
            reply["output"] = output[:limit]
            if request.get("keep"):
                self.kept["bash.out"] = output
                reply["kept"], reply["kept_bytes"] = "bash.out", len(output.encode())
        return reply

    async def python(self, request: PythonRequest, wait_s: float) -> PythonReply:
        await self._arrive("python", request, wait_s)
        return {"ok": True, "output": "", "exit_code": 0, "timed_out": False, "note": ""}

    async def read(self, request: ReadRequest, wait_s: float) -> ReadReply:
        await self._arrive("read", request, wait_s)
        path = self._path(request["path"])
        content = self._file(path)
        return {"ok": True, "path": path, "content": content, "total_lines": content.count("\n")}

    async def write(self, request: WriteRequest, wait_s: float) -> WriteReply:
        await self._arrive("write", request, wait_s)
        path = self._path(request["path"])
        previous = self.files.get(path)
        self.files[path] = request["content"]
        reply: WriteReply = {"ok": True, "path": path, "size": len(request["content"].encode())}
        if previous is not None:  # as the executor answers (deploy/sandbox/executor/files.py)
            reply["previous_size"] = len(previous.encode())
            reply["unchanged"] = previous == request["content"]
        return reply

    async def edit(self, request: EditRequest, wait_s: float) -> EditReply:
        await self._arrive("edit", request, wait_s)
        path = self._path(request["path"])
        if request["command"] == "create":
            if path in self.files:
                raise ExecutorError("file_exists", f"{path} already exists")
            self.files[path] = request.get("file_text") or ""
            return {"ok": True, "path": path, "content": f"Created {path}", "diff": ""}
        if request["command"] == "str_replace":
            old, new = request.get("old_str") or "", request.get("new_str") or ""
            text = self._file(path)
            if text.count(old) != 1:
                raise ExecutorError("no_match", f"old_str is not once in {path}")
            self.files[path] = text.replace(old, new)
            return {"ok": True, "path": path, "content": f"Edited {path}", "diff": f"-{old}+{new}"}
        raise ExecutorError("bad_request", f"the fake sandbox has no {request['command']!r}")

    async def scan(self, request: ScanRequest, wait_s: float) -> ScanReply:
        """Every file of `files` under /workspace (no folders, one page)."""
        await self._arrive("scan", request, wait_s)
        now: dict[str, ScanEntry] = {}
        for path, text in self.files.items():
            if path.startswith(WORKSPACE + "/"):
                data = text.encode()
                rel = path[len(WORKSPACE) + 1 :]
                sha = hashlib.sha256(data).hexdigest()
                now[rel] = {"p": rel, "t": "f", "m": 0o644, "s": len(data), "h": sha}
        full = bool(request.get("full"))
        changed = [e for p, e in now.items() if full or self.committed.get(p) != e]
        deleted = [] if full else [p for p in self.committed if p not in now]
        self.pending = now
        return {
            "ok": True,
            "scan": "1",
            "changed": changed,
            "deleted": deleted,
            "more": False,
            "total": len(changed),
            "files": len(now),
            "bytes": sum(e["s"] for e in now.values()),
            "skipped": 0,
            "too_large": False,
        }

    async def pack(self, request: PackRequest, wait_s: float) -> PackReply:
        """Whole files, however many bytes (the fake's files are small)."""
        await self._arrive("pack", request, wait_s)
        data = b""
        pieces: list[Any] = []
        for index, rel in enumerate(request["files"]):
            text = self.files.get(f"{WORKSPACE}/{rel}")
            if text is None:
                pieces.append({"i": index, "n": 0, "end": True, "error": "gone"})
                continue
            content = text.encode()[request.get("start", 0) if index == 0 else 0 :]
            data += content
            pieces.append({"i": index, "n": len(content), "end": True})
        return {"ok": True, "data": base64.b64encode(data).decode(), "pieces": pieces}

    async def commit(self, request: CommitRequest, wait_s: float) -> CommitReply:
        await self._arrive("commit", request, wait_s)
        if self.pending is None:
            raise ExecutorError("not_found", "no pending scan")
        self.committed, self.pending = self.pending, None
        return {"ok": True}

    async def chunk(self, request: ChunkRequest, wait_s: float) -> ChunkReply:
        await self._arrive("chunk", request, wait_s)
        whole = self.kept.get(request["name"])
        if whole is None:
            raise ExecutorError("not_found", f"the kept output {request['name']!r} is gone")
        # ASCII outputs only: a piece may end inside a character.
        data = whole.encode()[request["offset"] : request["offset"] + request.get("size", 4)]
        end = request["offset"] + len(data)
        eof = end >= len(whole.encode())
        if eof and request.get("drop"):
            del self.kept[request["name"]]
        return {"ok": True, "data": data.decode(), "next": end, "eof": eof}

    # -- files

    @staticmethod
    def _path(path: str) -> str:
        return posixpath.normpath(posixpath.join(WORKSPACE, path))

    def _file(self, path: str) -> str:
        if path not in self.files:
            raise ExecutorError("file_not_found", f"{path} does not exist")
        return self.files[path]
