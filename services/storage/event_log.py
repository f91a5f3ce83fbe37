"""The durable per-task event log: SQLite, one row per (task, seq).

Writes are group-committed: every event waiting when the writer thread comes free goes into one
transaction (one fsync), so hundreds of handlers storing at once cost a few commits, not hundreds.
A handler's `append` returns only once its row is durable, so the message is acked only then.
Reads use their own connection (WAL lets them run beside the writer) and never skip a seq: events
of one task may commit out of order, so a read stops at the first seq not yet stored.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from shared.delivery import PermanentError

from .metrics import GROUP_SIZE

__all__ = ["EventLog", "HistoryPage"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS deleted_tasks (
    task_id TEXT PRIMARY KEY
) WITHOUT ROWID;
"""

# More rows than this in one transaction would make the first of them wait for the last.
_MAX_GROUP = 512


@dataclass(frozen=True)
class _Row:
    task_id: str
    seq: int
    event_id: str
    kind: str
    body: str


@dataclass
class HistoryPage:
    """A gap-free run of events after a seq, and how far the reader may hope to read now."""

    events: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0


class EventLog:
    """SQLite work runs on worker threads, so the event loop never waits on the disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._writer: sqlite3.Connection | None = None
        self._reader: sqlite3.Connection | None = None
        self._read_lock = asyncio.Lock()
        self._pending: list[tuple[_Row, asyncio.Future[bool]]] = []
        self._wake = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        # One writer connection: a group commit and a removal never use it at once.
        self._write_lock = asyncio.Lock()

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

        def _connect() -> tuple[sqlite3.Connection, sqlite3.Connection]:
            writer = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            writer.execute("PRAGMA journal_mode=WAL")
            writer.execute("PRAGMA synchronous=FULL")
            writer.executescript(_SCHEMA)
            reader = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            return writer, reader

        self._writer, self._reader = await asyncio.to_thread(_connect)
        self._flusher = asyncio.create_task(self._flush_forever(), name="storage-group-commit")

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
            self._flusher = None
        for _, waiter in self._pending:
            if not waiter.done():
                waiter.set_exception(RuntimeError("event log closed before the event was stored"))
        self._pending.clear()
        for db in (self._writer, self._reader):
            if db is not None:
                await asyncio.to_thread(db.close)
        self._writer = self._reader = None

    async def append(self, task_id: str, seq: int, event_id: str, kind: str, body: str) -> bool:
        """Store an event durably; True if new, False if this exact event was stored before."""
        if self._writer is None:
            raise RuntimeError("event log is not open")
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._pending.append((_Row(task_id, seq, event_id, kind, body), waiter))
        self._wake.set()
        return await waiter

    async def append_many(
        self, rows: list[tuple[str, int, str, str, str]]
    ) -> list[bool | BaseException]:
        """`append` for several events at once (one commit group): per row, True if new, False
        if stored before, or the exception that kept it out."""
        if self._writer is None:
            raise RuntimeError("event log is not open")
        loop = asyncio.get_running_loop()
        waiters: list[asyncio.Future[bool]] = []
        for row in rows:
            waiter: asyncio.Future[bool] = loop.create_future()
            self._pending.append((_Row(*row), waiter))
            waiters.append(waiter)
        self._wake.set()
        return await asyncio.gather(*waiters, return_exceptions=True)

    async def _flush_forever(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._pending:
                group, self._pending = self._pending[:_MAX_GROUP], self._pending[_MAX_GROUP:]
                await self._commit(group)

    async def _commit(self, group: list[tuple[_Row, asyncio.Future[bool]]]) -> None:
        assert self._writer is not None
        try:
            async with self._write_lock:
                rows = [r for r, _ in group]
                outcomes = await asyncio.to_thread(_write_group, self._writer, rows)
        except Exception as exc:  # the disk failed: every handler in the group retries
            for _, waiter in group:
                if not waiter.done():
                    waiter.set_exception(exc)
            return
        GROUP_SIZE.observe(len(group))
        for (_, waiter), outcome in zip(group, outcomes, strict=True):
            if waiter.done():
                continue  # its handler gave up (cancelled); the row is stored all the same
            if isinstance(outcome, Exception):
                waiter.set_exception(outcome)
            else:
                waiter.set_result(outcome)

    async def forget(self, task_id: str) -> int:
        """Remove every stored event of the task (it was deleted); how many there were. The
        task is remembered as deleted: an event of it that comes later (a redelivery, a
        replica catching up) is not stored again."""
        if self._writer is None:
            raise RuntimeError("event log is not open")
        async with self._write_lock:
            return await asyncio.to_thread(_delete_task, self._writer, task_id)

    async def read(self, task_id: str, after: int, limit: int, max_bytes: int) -> HistoryPage:
        """Events with seq > after, in order, without a gap, at most `limit` of them and about
        `max_bytes` of JSON (always at least one event when one is readable)."""
        if self._reader is None:
            raise RuntimeError("event log is not open")
        async with self._read_lock:
            return await asyncio.to_thread(_read, self._reader, task_id, after, limit, max_bytes)


def _write_group(db: sqlite3.Connection, rows: list[_Row]) -> list[bool | Exception]:
    outcomes: list[bool | Exception] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        for row in rows:
            outcomes.append(_insert(db, row))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return outcomes


def _delete_task(db: sqlite3.Connection, task_id: str) -> int:
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("INSERT OR IGNORE INTO deleted_tasks (task_id) VALUES (?)", (task_id,))
        removed = db.execute("DELETE FROM events WHERE task_id = ?", (task_id,)).rowcount
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return int(removed)


def _insert(db: sqlite3.Connection, row: _Row) -> bool | Exception:
    if db.execute("SELECT 1 FROM deleted_tasks WHERE task_id = ?", (row.task_id,)).fetchone():
        return False  # the task was deleted: what comes of it late is not kept
    try:
        db.execute(
            "INSERT INTO events (task_id, seq, id, kind, body) VALUES (?, ?, ?, ?, ?)",
            (row.task_id, row.seq, row.event_id, row.kind, row.body),
        )
    except sqlite3.IntegrityError:  # SQLite undoes only this statement; the group goes on
        stored = db.execute(
            "SELECT id FROM events WHERE task_id = ? AND seq = ?", (row.task_id, row.seq)
        ).fetchone()
        if stored is not None and stored[0] == row.event_id:
            return False  # a redelivery of what is already stored
        return PermanentError(
            f"task {row.task_id} seq {row.seq}: event {row.event_id} conflicts with stored event "
            f"{stored[0] if stored else '(same id at another seq)'}"
        )
    return True


def _read(
    db: sqlite3.Connection, task_id: str, after: int, limit: int, max_bytes: int
) -> HistoryPage:
    # One read transaction, so the page and the highest seq agree.
    db.execute("BEGIN")
    try:
        rows = db.execute(
            "SELECT seq, body FROM events WHERE task_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (task_id, after, limit),
        ).fetchall()
        highest = db.execute("SELECT MAX(seq) FROM events WHERE task_id = ?", (task_id,)).fetchone()
    finally:
        db.execute("COMMIT")
    page = HistoryPage(last_seq=int(highest[0] or 0))
    expected, size = after + 1, 0
    for seq, body in rows:
        if seq != expected:
            # Not stored yet (a later event committed first): nothing past it is readable now.
            page.last_seq = expected - 1
            break
        size += len(body.encode()) + 1
        if page.events and size > max_bytes:
            break
        page.events.append(json.loads(body))
        expected += 1
    return page
