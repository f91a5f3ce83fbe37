"""`SandboxSession`: what the runtime can ask of one sandbox, and the two ways asking fails.

The runtime's client of the executor (services/runtime/executor_client.py) implements it over
the container's attached stdin and stdout; a test double implements it in-process
(tests/fakes/sandbox.py). Everything above it, running an action, seating, keeping outputs,
depends on this interface alone.
"""

from __future__ import annotations

from typing import Protocol

from .messages import (
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
    ScanReply,
    ScanRequest,
    WriteReply,
    WriteRequest,
)

__all__ = ["ExecutorError", "SandboxLost", "SandboxSession", "SandboxSessionError", "answers"]


class SandboxSessionError(Exception):
    """The root of what a call on a SandboxSession raises (besides TimeoutError)."""


class SandboxLost(SandboxSessionError):
    """The container (or its executor) is gone; its workspace and sessions with it."""


class ExecutorError(SandboxSessionError):
    """The executor refused the request (an ErrorReply): the code says why, for the agent."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class SandboxSession(Protocol):
    """One sandbox's executor. Every call waits at most `wait_s` (then TimeoutError), raises
    ExecutorError when the executor refuses and SandboxLost when the sandbox is gone; after a
    SandboxLost every later call raises it too."""

    @property
    def name(self) -> str:
        """The sandbox's container name, for logs."""
        ...

    @property
    def lost_reason(self) -> str | None:
        """Why the sandbox is gone, or None while it answers."""
        ...

    @property
    def violated(self) -> bool:
        """Something in the sandbox wrote into the executor's channel (the sandbox is lost)."""
        ...

    async def ping(self, wait_s: float) -> PingReply: ...

    async def bash(self, request: BashRequest, wait_s: float) -> BashReply: ...

    async def python(self, request: PythonRequest, wait_s: float) -> PythonReply: ...

    async def read(self, request: ReadRequest, wait_s: float) -> ReadReply: ...

    async def write(self, request: WriteRequest, wait_s: float) -> WriteReply: ...

    async def edit(self, request: EditRequest, wait_s: float) -> EditReply: ...

    async def chunk(self, request: ChunkRequest, wait_s: float) -> ChunkReply: ...

    async def scan(self, request: ScanRequest, wait_s: float) -> ScanReply: ...

    async def pack(self, request: PackRequest, wait_s: float) -> PackReply: ...

    async def commit(self, request: CommitRequest, wait_s: float) -> CommitReply: ...

    async def close(self) -> None:
        """Stop talking to the sandbox (it keeps running); later calls raise SandboxLost."""
        ...


async def answers(session: SandboxSession, wait_s: float) -> bool:
    """Whether the sandbox answers a ping within `wait_s` (a health check: never raises)."""
    try:
        await session.ping(wait_s)
    except (SandboxSessionError, TimeoutError):
        return False
    return True
