"""The secrets a task's requests get at the egress (shared/secret_egress.py): read from the
secrets store by task, with a Redis user that may read only secrets, and kept a moment.

The proxy is a reader of the store like the runtime: the value never travels in a message, a
file or the sandbox. A secret rewritten or deleted is what the task's next connection gets,
after at most DECKHANDS_EGRESS_SECRETS_CACHE_S.
"""

from __future__ import annotations

import logging
import time

from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared.secrets_store import SecretsCipher, SecretsStore, SecretUnreadable, StoredSecret

from .settings import EgressSettings

__all__ = ["SecretHeaders"]

log = logging.getLogger("deckhands.egress")


class SecretHeaders:
    def __init__(self, store: SecretsStore | None, cache_s: float = 2.0) -> None:
        self.store = store
        self.cache_s = cache_s
        self._cache: dict[str, tuple[float, list[StoredSecret]]] = {}

    @classmethod
    def from_settings(cls, settings: EgressSettings, redis: Redis | None) -> SecretHeaders:
        """None of them without Redis or a secrets key; ValueError naming a malformed key."""
        key = settings.secrets_key.get_secret_value()
        if redis is None or not key:
            return cls(None)
        cipher = SecretsCipher.from_text(key, settings.secrets_previous_keys.get_secret_value())
        return cls(SecretsStore(redis, cipher), settings.secrets_cache_s)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    async def _bound(self, task_id: str) -> list[StoredSecret]:
        if self.store is None:
            return []
        now = time.monotonic()
        cached = self._cache.get(task_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            stored = await self.store.stored_for_task(task_id)
        except (RedisError, OSError, SecretUnreadable) as exc:
            # Nothing is added: the host answers as to a request without the credential.
            log.error("task %s: its secrets cannot be read: %s", task_id, exc)
            return []
        bound = [s for s in stored if s.egress is not None]
        if len(self._cache) > 4096:
            self._cache = {t: c for t, c in self._cache.items() if c[0] > now}
        self._cache[task_id] = (now + self.cache_s, bound)
        return bound

    async def for_host(self, task_id: str, host: str, port: int) -> list[StoredSecret]:
        """The task's secrets bound to `host`:`port` (as the sandbox named it)."""
        return [s for s in await self._bound(task_id) if s.egress and s.egress.covers(host, port)]
