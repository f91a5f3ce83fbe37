"""The durable record of tenants, API key hashes and limits: the JetStream key-value bucket
TENANTS_BUCKET, replicated like the streams (DECKHANDS_STREAM_REPLICAS) and declared with them
(tools.streams). Redis only caches what a request needs (services.gateway.tenants.store), so a Redis
that lost its data refills from here: keys still authenticate, limits still apply.

Keys in the bucket:
- `tenant.<id>`: the tenant (a deleted one stays, as a tombstone: its id is never reused);
- `limits.<id>`: the limits the operator set for it;
- `apikey.<tenant>.<prefix>`: a key's record (never the key), kept after revocation;
- `credential.<sha256>`: the credential a request looks up; revocation deletes it;
- `task.<tenant>.<task id>`: who owns a task made through the API, and its labels
  (services.gateway.tasks.records); deleting the task deletes it;
- `idem.<tenant>.<sha256 of the key>`: an Idempotency-Key's binding, until it expires
  (services.gateway.tasks.idempotency).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from shared.subjects import TENANTS_BUCKET

from ..errors import StorageUnavailable

__all__ = ["TenantRecords"]

_TIMEOUT_S = 5.0
_READ_BATCH = 256


class TenantRecords:
    """Get, put and list records of the bucket; every failure is a StorageUnavailable (503).

    `jetstream` gives the connection's JetStream context when first needed: the gateway builds
    its parts before the broker connects."""

    def __init__(
        self,
        jetstream: Callable[[], JetStreamContext],
        timeout_s: float = _TIMEOUT_S,
        bucket: str = TENANTS_BUCKET,
    ) -> None:
        self._jetstream = jetstream
        self.bucket = bucket
        self._timeout_s = timeout_s
        self._kv: KeyValue | None = None

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self._jetstream().key_value(self.bucket)
        return self._kv

    def _unavailable(self, exc: BaseException) -> StorageUnavailable:
        return StorageUnavailable(
            f"tenant store (NATS key-value {self.bucket!r}) unavailable: "
            f"{type(exc).__name__}: {exc}"
        )

    async def get(self, key: str) -> bytes | None:
        try:
            kv = await self._bucket()
            entry = await asyncio.wait_for(kv.get(key), self._timeout_s)
        except KeyNotFoundError:
            return None
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return entry.value or None

    async def entry(self, key: str) -> tuple[bytes, int] | None:
        """The record and its revision, for a compare-and-set (`replace`)."""
        try:
            kv = await self._bucket()
            entry = await asyncio.wait_for(kv.get(key), self._timeout_s)
        except KeyNotFoundError:
            return None
        except Exception as exc:
            raise self._unavailable(exc) from exc
        if not entry.value or entry.revision is None:
            return None
        return entry.value, entry.revision

    async def replace(self, key: str, value: bytes, revision: int) -> bool:
        """Put the record if it is still at `revision`; False if it changed meanwhile."""
        try:
            kv = await self._bucket()
            await asyncio.wait_for(kv.update(key, value, last=revision), self._timeout_s)
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return True

    async def put(self, key: str, value: bytes) -> None:
        try:
            kv = await self._bucket()
            await asyncio.wait_for(kv.put(key, value), self._timeout_s)
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def create(self, key: str, value: bytes) -> bool:
        """Put the record unless one is there; False if one was."""
        try:
            kv = await self._bucket()
            await asyncio.wait_for(kv.create(key, value), self._timeout_s)
        except KeyWrongLastSequenceError:
            return False
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return True

    async def delete(self, key: str) -> None:
        try:
            kv = await self._bucket()
            await asyncio.wait_for(kv.delete(key), self._timeout_s)
        except KeyNotFoundError:
            return
        except Exception as exc:
            raise self._unavailable(exc) from exc

    async def values(self, pattern: str) -> list[tuple[str, bytes]]:
        """Every live record whose key matches `pattern` (NATS wildcards), in the order they
        were last written.

        Read through a pull consumer of our own rather than nats-py's `KeyValue.watch`: the
        watcher's "caught up" marker races with its first delivery (it can come before the only
        record), so a listing could come back empty. A pull consumer's pending count is exact at
        creation, and each record says how many are left after it."""
        found: list[tuple[str, bytes]] = []
        prefix, stream = f"$KV.{self.bucket}.", f"KV_{self.bucket}"
        try:
            await self._bucket()  # a missing bucket says so here
            reader = await asyncio.wait_for(
                self._jetstream().pull_subscribe(
                    prefix + pattern,
                    stream=stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
                        ack_policy=AckPolicy.NONE,
                        inactive_threshold=60.0,  # the server drops it if we cannot
                        mem_storage=True,
                    ),
                ),
                self._timeout_s,
            )
            info = None
            try:
                info = await asyncio.wait_for(reader.consumer_info(), self._timeout_s)
                left = info.num_pending or 0
                while left > 0:
                    batch = await reader.fetch(min(left, _READ_BATCH), timeout=self._timeout_s)
                    for msg in batch:
                        left = msg.metadata.num_pending or 0
                        if _is_live(msg.headers) and msg.data:
                            found.append((msg.subject[len(prefix) :], msg.data))
            finally:
                await reader.unsubscribe()
                if info is not None and info.name:  # else the server drops it when idle
                    await asyncio.wait_for(
                        self._jetstream().delete_consumer(stream, info.name), self._timeout_s
                    )
        except Exception as exc:
            raise self._unavailable(exc) from exc
        return found


def _is_live(headers: dict[str, str] | None) -> bool:
    """False for a delete or purge marker (a client's KV-Operation header, or the server's
    Nats-Marker-Reason on 2.11+)."""
    if not headers:
        return True
    return headers.get("KV-Operation") not in ("DEL", "PURGE") and not headers.get(
        "Nats-Marker-Reason"
    )
