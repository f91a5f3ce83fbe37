"""The durable per-task event log: SQLite, one row per (task, seq)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

from shared.delivery import PermanentError

__all__ = ["EventLog"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    task_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (task_id, seq)
) WITHOUT ROWID;
"""


class EventLog:
    """All SQLite work runs on one worker thread, so the event loop never waits on the disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)

        def _open() -> sqlite3.Connection:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.executescript(_SCHEMA)
            return db

        self._db = await asyncio.to_thread(_open)

    async def close(self) -> None:
        if self._db is not None:
            await asyncio.to_thread(self._db.close)
            self._db = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._db is None:
            raise RuntimeError("event log is not open")
        async with self._lock:
            return await asyncio.to_thread(fn, self._db, *args)

    async def append(self, task_id: str, seq: int, event_id: str, kind: str, body: str) -> bool:
        """Store an event; True if new, False if this exact event was stored before."""
        return bool(await self._run(_append, task_id, seq, event_id, kind, body))

    async def read(self, task_id: str, after: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        return await self._run(_read, task_id, after, limit)  # type: ignore[no-any-return]


def _append(db: sqlite3.Connection, task_id: str, seq: int, eid: str, kind: str, body: str) -> bool:
    try:
        db.execute(
            "INSERT INTO events (task_id, seq, id, kind, body) VALUES (?, ?, ?, ?, ?)",
            (task_id, seq, eid, kind, body),
        )
    except sqlite3.IntegrityError:
        row = db.execute(
            "SELECT id FROM events WHERE task_id = ? AND seq = ?", (task_id, seq)
        ).fetchone()
        if row is not None and row[0] == eid:
            return False  # a redelivery of what is already stored
        raise PermanentError(
            f"task {task_id} seq {seq}: event {eid} conflicts with stored event "
            f"{row[0] if row else '(same id at another seq)'}"
        ) from None
    return True


def _read(db: sqlite3.Connection, task_id: str, after: int, limit: int) -> tuple[list[Any], int]:
    rows = db.execute(
        "SELECT body FROM events WHERE task_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (task_id, after, limit),
    ).fetchall()
    last = db.execute("SELECT MAX(seq) FROM events WHERE task_id = ?", (task_id,)).fetchone()
    return [json.loads(body) for (body,) in rows], int(last[0] or 0)
