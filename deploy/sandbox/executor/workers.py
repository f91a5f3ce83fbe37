"""The loaded executor: the sessions, a worker thread for each, and the router that feeds them.

Requests for different parts run concurrently (a ping is answered while a command runs);
requests for the same part run in order, in its worker. Loaded by the dispatcher's `_boot`
once the first pings are answered.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time

from shared.sandbox_protocol import PROTOCOL_VERSION

from .bash import BashSession
from .config import Fail, log
from .files import Files
from .kernel import PythonSession
from .snapshot import Snapshots

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from shared.sandbox_protocol.messages import ErrorCode, ErrorReply, PingReply

    # An operation's handler: a request as it came off the wire (untrusted JSON, which the
    # handler coerces field by field) to its reply; a refusal is raised as Fail.
    Handler = Callable[[Any], Mapping[str, object]]
    Jobs = queue.Queue[dict[str, Any]]


class Responder:
    """Writes one JSON line per response (through the dispatcher's `write`, which keeps lines
    whole across threads)."""

    def __init__(self, write: Callable[[bytes], None]) -> None:
        self.write = write

    def send(self, message: Mapping[str, object]) -> None:
        self.write((json.dumps(message, ensure_ascii=False) + "\n").encode("utf-8", "replace"))


def _error(code: ErrorCode, message: str) -> ErrorReply:
    return {"ok": False, "code": code, "error": message}


def _worker(
    jobs: Jobs, handler: Handler, responder: Responder, warmup: Callable[[], None] | None
) -> None:
    if warmup is not None:
        try:
            warmup()
        except Exception as exc:  # retried by the first request
            log(f"warm-up failed: {exc}")
    while True:
        req = jobs.get()
        rid = req.get("id")
        answer: Mapping[str, object]
        try:
            answer = handler(req)
        except Fail as exc:
            answer = _error(exc.code, str(exc))
        except Exception as exc:
            import traceback

            log(f"request {rid} failed: {traceback.format_exc()}")
            answer = _error("executor_error", f"{type(exc).__name__}: {exc}")
        responder.send({**answer, "id": rid})


class Router:
    """Parses a request line and answers it (ping, or a refusal) or queues it for its worker."""

    def __init__(self, routes: dict[str, Jobs], responder: Responder, started: float) -> None:
        self.routes = routes
        self.responder = responder
        self.started = started

    def route(self, raw: bytes) -> None:
        try:
            req = json.loads(raw)
            if not isinstance(req, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            self.responder.send({"id": None, **_error("bad_request", str(exc))})
            return
        op = str(req.get("op"))
        if op == "ping":
            ping: PingReply = {
                "ok": True,
                "pid": os.getpid(),
                "protocol": PROTOCOL_VERSION,
                "uptime_s": time.monotonic() - self.started,
            }
            self.responder.send({"id": req.get("id"), **ping})
        elif op in self.routes:
            self.routes[op].put(req)
        else:
            self.responder.send(
                {"id": req.get("id"), **_error("bad_request", f"unknown op {op!r}")}
            )


def _harden_self() -> None:
    # Not dumpable: the sandbox user's own processes cannot open /proc/<executor>/fd/* (its
    # pipes to the channel's holder, deploy/sandbox/holder.py) to read or forge protocol
    # traffic, nor ptrace it.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4


def start(write: Callable[[bytes], None], started: float) -> Callable[[bytes], None]:
    """Start the sessions' workers (the shell first); the router's `route` for every line."""
    # Before any of the agent's code can run (the shell starts below).
    _harden_self()
    os.makedirs(os.environ.get("HOME", "/tmp/home"), exist_ok=True)
    responder = Responder(write)
    python = PythonSession()
    bash = BashSession(python_pid=python.pid)
    files = Files()
    file_ops: dict[str, Handler] = {"read": files.read, "write": files.write, "edit": files.edit}
    snapshots = Snapshots()
    snapshot_ops: dict[str, Handler] = {
        "scan": snapshots.scan,
        "pack": snapshots.pack,
        "commit": snapshots.commit,
    }

    # Workers exist before any user code runs: under a fork bomb no thread could start.
    # The shell starts in its worker; commands queue behind it.
    parts: tuple[tuple[tuple[str, ...], Handler, Callable[[], None] | None], ...] = (
        (("bash",), bash.run, bash.start),
        (("python",), python.run, None),
        (("read", "write", "edit"), lambda req: file_ops[req["op"]](req), None),
        (("chunk",), files.chunk, None),
        # Checkpoints (issue 28): a part of their own, so a scan never waits behind a file
        # operation, nor one behind a scan.
        (("scan", "pack", "commit"), lambda req: snapshot_ops[req["op"]](req), None),
    )
    routes: dict[str, Jobs] = {}
    for ops, handler, warmup in parts:
        jobs: Jobs = queue.Queue()
        threading.Thread(
            target=_worker, args=(jobs, handler, responder, warmup), daemon=True
        ).start()
        for op in ops:
            routes[op] = jobs
    return Router(routes, responder, started).route
