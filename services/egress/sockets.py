"""Each sandbox's way in: a unix socket per proxy replica in the sandbox's folder.

The runtime makes a folder for each sandbox with a network policy, writes its policy.json and
mounts the folder read-only into the sandbox; that sandbox has no network at all, only this
folder. This replica listens on `<folder>/<replica>.sock` for every folder it finds (read again
every scan_interval_s, so a restarted replica takes up every sandbox at once), relays each
connection to mitmproxy on loopback, and registers who it is from (links.py). The folder a
connection came through is the only thing that says whose it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import time
from datetime import datetime
from pathlib import Path

from pydantic import ValidationError

from shared.egress_policy import SANDBOX_EGRESS_FILE, SandboxEgress
from shared.events import EgressConnection

from .activity import Activity, now
from .handoff import CountedStream, StreamHandler
from .links import Link, Links
from .metrics import BYTES, CONNECTIONS, OPEN, SANDBOXES
from .passed_sockets import PassedSockets
from .settings import EgressSettings
from .usage import EgressUsage

__all__ = ["SandboxSockets"]

log = logging.getLogger("deckhands.egress")

_FOLDER = re.compile(r"^[A-Za-z0-9_-]{1,80}$")
_CHUNK = 256 * 1024
# The peer "ports" mitmproxy reads for sandbox connections (handoff.py): above any real port.
_FIRST_KEY = 1 << 20
# How many connections a replica starts at once, and how long one may hold its place: FIFO, so
# a sandbox opening many (a flood, a slow host) delays another's by at most about this.
_STARTING = 64
_START_HOLD_S = 0.5


def _refusal(body: bytes) -> bytes:
    """A 429 the sandbox's client reads, written before any byte of its request is."""
    return (
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: text/plain\r\nConnection: close\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )


_TOO_MANY = _refusal(b"deckhands egress proxy: too many connections open for this task\n")


class _Sandbox:
    def __init__(self, folder: Path, egress: SandboxEgress, mtime: float) -> None:
        self.folder = folder
        self.egress = egress
        self.mtime = mtime
        self.open = 0
        self.server: asyncio.Server | None = None
        self.passed: PassedSockets | None = None
        # Each open connection's link and its counted stream, to cut when the policy narrows.
        self.relays: dict[int, tuple[Link, CountedStream]] = {}

    def follow(self, egress: SandboxEgress, mtime: float) -> None:
        """A new policy (an action's scope, nothing between actions, a user's widening): new
        connections and new requests follow it, and a connection to a destination it no longer
        allows is cut (a background process's download after its action ended)."""
        self.egress, self.mtime = egress, mtime
        for key, (link, stream) in list(self.relays.items()):
            link.sandbox = egress
            if all(_allows(egress, host, port) for host, port in link.reached):
                continue
            link.refused = "out_of_scope"
            link.destinations.append(("-", 0, False, "out_of_scope"))
            CONNECTIONS.labels(egress.tenant_id or "-", "out_of_scope").inc()
            stream.close()
            self.relays.pop(key, None)


class SandboxSockets:
    def __init__(
        self,
        settings: EgressSettings,
        links: Links,
        activity: Activity | None = None,
        usage: EgressUsage | None = None,
    ) -> None:
        self.settings = settings
        self.links = links
        self.activity = activity
        self.usage = usage or EgressUsage(None)
        self.root = Path(settings.dir)
        self.proxy: StreamHandler | None = None  # mitmproxy's, set once it runs
        self._keys = itertools.count(_FIRST_KEY)
        # Connections starting at once (until their first answer byte, or _START_HOLD_S):
        # thousands started together slowed every one of them past its client's timeout.
        self._starting = asyncio.Semaphore(_STARTING)
        self._sandboxes: dict[str, _Sandbox] = {}

    @property
    def socket_name(self) -> str:
        return f"{self.settings.replica}.sock"

    @property
    def handoff_name(self) -> str:
        """Where the sandbox's relay passes its connections themselves (passed_sockets.py)."""
        return f"{self.settings.replica}.handoff"

    async def run(self) -> None:
        while True:
            try:
                await self.scan()
            except OSError as exc:
                log.warning("cannot read %s: %s", self.root, exc)
            await asyncio.sleep(self.settings.scan_interval_s)

    async def scan(self) -> None:
        seen: set[str] = set()
        with os.scandir(self.root) as entries:
            folders = [e for e in entries if e.is_dir() and _FOLDER.match(e.name)]
        for entry in folders:
            policy_file = Path(entry.path) / SANDBOX_EGRESS_FILE
            try:
                mtime = policy_file.stat().st_mtime
            except FileNotFoundError:
                continue  # being made
            seen.add(entry.name)
            known = self._sandboxes.get(entry.name)
            if known is not None and known.mtime == mtime:
                continue
            egress = self._read(policy_file)
            if egress is None:
                continue
            if known is not None:  # its policy changed: connections follow it
                known.follow(egress, mtime)
                continue
            await self._listen(_Sandbox(Path(entry.path), egress, mtime), entry.name)
        for name in set(self._sandboxes) - seen:
            await self._close(name)
        SANDBOXES.set(len(self._sandboxes))

    def _reread(self, sandbox: _Sandbox) -> None:
        path = sandbox.folder / SANDBOX_EGRESS_FILE
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime != sandbox.mtime and (egress := self._read(path)) is not None:
            sandbox.follow(egress, mtime)

    def _read(self, path: Path) -> SandboxEgress | None:
        try:
            return SandboxEgress.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as exc:
            log.warning("ignoring %s: %s", path, exc)
            return None

    async def _listen(self, sandbox: _Sandbox, name: str) -> None:
        path = sandbox.folder / self.socket_name
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # this replica's, left by its previous run

        async def on_connection(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await self._relay(sandbox, r, w)

        try:
            sandbox.server = await asyncio.start_unix_server(on_connection, path, limit=_CHUNK)
            # The sandbox's relay runs as its own uid: it must be able to connect.
            os.chmod(path, 0o666)
            sandbox.passed = PassedSockets(
                sandbox.folder / self.handoff_name,
                on_connection,
                limit=_CHUNK,
                max_waiting=self.settings.max_connections_per_task,
            )
            sandbox.passed.start()
        except OSError as exc:
            log.warning("cannot listen for sandbox %s: %s", name, exc)
            if sandbox.server is not None:
                sandbox.server.close()
            return
        self._sandboxes[name] = sandbox
        log.info("listening for task %s's sandbox (%s)", sandbox.egress.task_id, name)

    async def _close(self, name: str) -> None:
        sandbox = self._sandboxes.pop(name)
        if sandbox.server is not None:
            sandbox.server.close()
        if sandbox.passed is not None:
            sandbox.passed.close()
        with contextlib.suppress(OSError):
            (sandbox.folder / self.socket_name).unlink()

    async def _relay(
        self, sandbox: _Sandbox, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._reread(sandbox)  # widened by a user's message just before this action?
        egress = sandbox.egress
        tenant = egress.tenant_id or "-"
        refusal = None
        if sandbox.open >= self.settings.max_connections_per_task:
            refusal = ("too_many", _TOO_MANY)
        elif (allowance := self.usage.allowance_used(tenant)) is not None:
            refusal = ("allowance_used", _allowance_used(allowance))
        if refusal is not None:
            CONNECTIONS.labels(tenant, refusal[0]).inc()
            self._record(egress.task_id, [("-", 0, False, refusal[0])], 0, 0, now(), 0.0)
            await _answer(reader, writer, refusal[1])
            return
        assert self.proxy is not None  # sandboxes are listened for once it runs
        sandbox.open += 1
        OPEN.inc()
        started, started_at = time.monotonic(), now()
        link = Link(egress, sandbox.folder.name)
        key = next(self._keys)

        def counted(count: int) -> bool:
            """Counts the bytes on the tenant's day; False: its allowance is used up."""
            self.usage.add(tenant, count)
            return self.usage.allowance_used(tenant) is None

        await self._starting.acquire()
        held = [True]

        def give_place() -> None:
            if held[0]:
                held[0] = False
                self._starting.release()

        release = asyncio.get_running_loop().call_later(_START_HOLD_S, give_place)
        stream = CountedStream(reader, writer, key, counted, give_place)
        self.links.add(key, link)
        sandbox.relays[key] = (link, stream)
        try:
            await self.proxy.handle_stream(reader, writer)
        except OSError as exc:
            log.warning("task %s: connection failed: %s", egress.task_id, exc)
        finally:
            release.cancel()
            give_place()
            if stream.cut and self.usage.allowance_used(tenant) is not None:
                CONNECTIONS.labels(tenant, "allowance_used").inc()
                link.destinations.append(("-", 0, False, "allowance_used"))
                link.refused = "allowance_used"
            sent, received = stream.sent, stream.received
            self.links.remove(key)
            sandbox.relays.pop(key, None)
            sandbox.open -= 1
            OPEN.dec()
            writer.close()
            BYTES.labels(tenant, "out").inc(sent)
            BYTES.labels(tenant, "in").inc(received)
            took = time.monotonic() - started
            self._record(
                egress.task_id,
                link.destinations,
                sent,
                received,
                started_at,
                took,
                tuple(sorted(link.secrets_added)),
            )
            log.info(
                "task %s: connection to %s: %s, %d bytes out, %d in, %.3f s",
                egress.task_id,
                ", ".join(link.hosts) or "-",
                f"refused ({link.refused})" if link.refused else "done",
                sent,
                received,
                time.monotonic() - started,
            )

    def _record(
        self,
        task_id: str,
        destinations: list[tuple[str, int, bool, str]],
        sent: int,
        received: int,
        started_at: datetime,
        took: float,
        secrets: tuple[str, ...] = (),
    ) -> None:
        """Each destination of a connection, for its task's log. The bytes and the time of a
        connection that reached several hosts (keep-alive) are counted on the first."""
        if self.activity is None:
            return
        counted = False
        for host, port, allowed, reason in destinations:
            first = allowed and not counted
            counted = counted or first
            self.activity.record(
                task_id,
                EgressConnection(
                    host=host[:300],
                    port=port,
                    allowed=allowed,
                    reason=reason,
                    bytes_out=sent if first else 0,
                    bytes_in=received if first else 0,
                    duration_s=round(took, 3) if first else 0.0,
                    started_at=started_at,
                    secrets=secrets if first else (),
                ),
            )

    async def close(self) -> None:
        for name in list(self._sandboxes):
            await self._close(name)


async def _answer(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, response: bytes
) -> None:
    """Answer a connection this replica refuses: its request's head read first, then the
    response and end of output, then its close awaited. Closed with the request unread, the
    sandbox's relay could see the connection reset before the response reached the client."""
    with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    with contextlib.suppress(OSError, TimeoutError):
        writer.write(response)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        await asyncio.wait_for(reader.read(), 2)
    writer.close()


def _allows(egress: SandboxEgress, host: str, port: int) -> bool:
    """Whether `egress` still allows a destination a connection reached (as checked then)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return egress.network.allows_name(host, port)
    policy = egress.network
    return policy.allows_address(address, port) or policy.names_private(address, port)


def _allowance_used(allowance: int) -> bytes:
    return _refusal(
        b"deckhands egress proxy: the tenant's egress allowance for today (%d bytes, both ways) "
        b"is used up; it renews at midnight UTC\n" % allowance
    )
