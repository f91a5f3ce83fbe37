"""Which tenant owns a task, its labels, and each tenant's tasks newest first: the gateway's own
records, next to the State the controller keeps.

Durable in NATS key-value (`task.<tenant>.<task id>` in the tenants bucket, written first), and
cached in Redis for every request: a Redis that lost its data is filled again from there, so a
task made before the loss keeps its owner (issue 12, part 2): a record missing from Redis is
looked up in the bucket, and a tenant's index that is not marked complete is built again from
the bucket's records before it is read.

The State (shared.state) is the controller's and stays as it is; tenancy is the gateway's
business, so its records live beside it:
- `deckhands:task-record:<task id>`: the TaskRecord (JSON) of a task created through the API.
  A sub-task (created by the controller) has none: it belongs to its root task's tenant.
- `deckhands:tenant:<id>:tasks`: the tenant's index, a sorted set whose members all score 0
  and read `<16 digits: 10^16-1 - creation time in µs>:<task id>`, so that the lexical order
  (ZRANGE BYLEX) is newest first, a cursor is a member, and a creation-time range is a lexical
  range.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from shared.events import utc_now

from ..errors import InvalidCursor
from ..tenants.records import TenantRecords

__all__ = ["IndexRange", "TaskRecord", "TaskRecords", "decode_cursor", "encode_cursor"]

_PREFIX = "deckhands"
_MAX_MICROS = 10**16 - 1  # the year 2286
_MEMBER = re.compile(r"^\d{16}:[A-Za-z0-9_-]{1,128}$")


class TaskRecord(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    labels: tuple[str, ...] = ()
    created_at: datetime = Field(default_factory=utc_now)
    idempotency_key: str | None = Field(
        default=None, description="The key the task was created with, freed when it is deleted."
    )


def _micros(at: datetime) -> int:
    return min(max(int(at.timestamp() * 1_000_000), 0), _MAX_MICROS)


def _member(task_id: str, created_at: datetime) -> str:
    return f"{_MAX_MICROS - _micros(created_at):016d}:{task_id}"


def encode_cursor(member: str) -> str:
    return base64.urlsafe_b64encode(member.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    try:
        member = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        member = ""
    if not _MEMBER.fullmatch(member):
        raise InvalidCursor("cursor: not a cursor this API returned (pass next_cursor as is)")
    return member


@dataclass(frozen=True)
class IndexRange:
    """Where a page of the index starts and ends: after a cursor, within creation times."""

    after_member: str | None = None
    created_after: datetime | None = None  # exclusive
    created_before: datetime | None = None  # exclusive

    def bounds(self) -> tuple[str, str]:
        """ZRANGE BYLEX bounds: newest first means from created_before down to created_after."""
        low: list[str] = ["-"]
        if self.after_member is not None:
            low.append("(" + self.after_member)
        if self.created_before is not None:
            # Past every member created at exactly created_before (';' sorts after ':').
            low.append(f"[{_MAX_MICROS - _micros(self.created_before):016d};")
        high = "+"
        if self.created_after is not None:
            high = f"({_MAX_MICROS - _micros(self.created_after):016d}:"
        return max(low, key=lambda bound: (bound != "-", bound[1:])), high


# The record and its index entry are written together, once: a retried creation (same
# Idempotency-Key) finds the record and adds no second entry to the index.
_PUT = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], 0, ARGV[2])
  return false
end
return redis.call('GET', KEYS[1])
"""


class TaskRecords:
    def __init__(
        self, redis: Redis, prefix: str = _PREFIX, durable: TenantRecords | None = None
    ) -> None:
        self.redis = redis
        self.prefix = prefix
        # The records' home (None: Redis alone, as in tests of the listing itself).
        self.durable = durable
        self._put = redis.register_script(_PUT)

    def _record(self, task_id: str) -> str:
        return f"{self.prefix}:task-record:{task_id}"

    def _index(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:tasks"

    def _index_complete(self, tenant_id: str) -> str:
        return f"{self.prefix}:tenant:{tenant_id}:tasks-complete"

    @staticmethod
    def _durable_key(tenant_id: str, task_id: str) -> str:
        return f"task.{tenant_id}.{task_id}"

    async def put(self, task_id: str, record: TaskRecord) -> TaskRecord:
        """Keep `record` unless the task has one already; the record kept. Written before the
        task's State, so that no State made through the API is ever without its owner."""
        return await self._cache(task_id, await self.put_durable(task_id, record))

    async def put_durable(self, task_id: str, record: TaskRecord) -> TaskRecord:
        """`put`'s first half: the record in the bucket (the one kept there, if the task has
        one); cache_in is the second."""
        if self.durable is not None:
            key = self._durable_key(record.tenant_id, task_id)
            if not await self.durable.create(key, record.model_dump_json().encode()):
                kept = await self.durable.get(key)
                if kept is not None:
                    record = TaskRecord.model_validate_json(kept)
        return record

    def cache_in(self, tx: Pipeline, task_id: str, record: TaskRecord) -> None:
        """Queue `put`'s Redis half on a transaction (with the task's creation request, one
        round trip for both). EVAL, not the registered script: a script on a pipeline costs
        redis-py a SCRIPT EXISTS round trip first; Redis caches the compiled script anyway."""
        tx.eval(
            _PUT,
            2,
            self._record(task_id),
            self._index(record.tenant_id),
            record.model_dump_json(),
            _member(task_id, record.created_at),
        )

    async def _cache(self, task_id: str, record: TaskRecord) -> TaskRecord:
        existing = await self._put(
            keys=[self._record(task_id), self._index(record.tenant_id)],
            args=[record.model_dump_json(), _member(task_id, record.created_at)],
        )
        return record if existing is None else TaskRecord.model_validate_json(existing)

    async def cached(self, task_id: str) -> TaskRecord | None:
        """The record as Redis has it (a sub-task has none: no need to look further)."""
        raw = await self.redis.get(self._record(task_id))
        return None if raw is None else TaskRecord.model_validate_json(raw)

    async def get(self, task_id: str) -> TaskRecord | None:
        """The record, from Redis or else from its durable copy (then cached again)."""
        record = await self.cached(task_id)
        if record is not None or self.durable is None:
            return record
        found = await self.durable.values(self._durable_key("*", task_id))
        if not found:
            return None
        return await self._cache(task_id, TaskRecord.model_validate_json(found[-1][1]))

    async def get_many(self, task_ids: list[str]) -> list[TaskRecord | None]:
        if not task_ids:
            return []
        raws = await self.redis.mget([self._record(task_id) for task_id in task_ids])
        return [None if raw is None else TaskRecord.model_validate_json(raw) for raw in raws]

    async def remove(self, task_id: str, record: TaskRecord) -> None:
        if self.durable is not None:  # first: a record left only in Redis goes with Redis
            await self.durable.delete(self._durable_key(record.tenant_id, task_id))
        async with self.redis.pipeline(transaction=True) as tx:
            tx.zrem(self._index(record.tenant_id), _member(task_id, record.created_at))
            tx.delete(self._record(task_id))
            await tx.execute()

    async def ensure_index(self, tenant_id: str) -> int:
        """Build the tenant's index again from the durable records unless Redis holds it whole
        (its marker is set once built, and goes with the index when Redis loses its data);
        the number of records put back. A record created meanwhile is in the durable scan or
        adds its own entry: both are the same member."""
        if self.durable is None or await self.redis.exists(self._index_complete(tenant_id)):
            return 0
        found = await self.durable.values(self._durable_key(tenant_id, "*"))
        async with self.redis.pipeline(transaction=False) as batch:
            for key, raw in found:
                record = TaskRecord.model_validate_json(raw)
                task_id = key.rsplit(".", 1)[1]
                batch.set(self._record(task_id), raw, nx=True)
                batch.zadd(self._index(tenant_id), {_member(task_id, record.created_at): 0})
            batch.set(self._index_complete(tenant_id), b"1")
            await batch.execute()
        return len(found)

    async def page(self, tenant_id: str, where: IndexRange, count: int) -> list[tuple[str, str]]:
        """Up to `count` (task id, index member) of the tenant, newest first."""
        low, high = where.bounds()
        members = await self.redis.zrangebylex(self._index(tenant_id), low, high, 0, count)
        out = []
        for raw in members:
            member = raw.decode() if isinstance(raw, bytes) else str(raw)
            out.append((member.partition(":")[2], member))
        return out
