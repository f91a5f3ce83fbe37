"""The log's safety net for secrets: every input of a task that may use secrets is redacted
(`<secret:NAME>`) before the controller applies it, so whatever the runtime missed, and whatever
a person or the agent typed, never reaches the log, the State, a prompt or the trajectory.

A task's values are read from the secrets store (shared/secrets_store.py, with the controller's
own Redis credentials) and kept for a few seconds: one Redis read per task per `ttl_s`, nothing
for a task created without secrets beyond that read.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

from shared.events import Event
from shared.secret_redaction import Redactor
from shared.secrets_store import SecretsStore, SecretUnreadable

__all__ = ["SecretFilter"]

log = logging.getLogger("deckhands.controller.secrets")


class SecretFilter:
    def __init__(self, store: SecretsStore | None, ttl_s: float = 5.0, size: int = 4096) -> None:
        self.store = store
        self.ttl_s = ttl_s
        self.size = size
        self._known: OrderedDict[str, tuple[float, Redactor]] = OrderedDict()

    async def _redactor(self, task_id: str) -> Redactor:
        now = time.monotonic()
        kept = self._known.get(task_id)
        if kept is not None and kept[0] > now:
            return kept[1]
        assert self.store is not None
        try:
            redactor = Redactor(await self.store.values_for_task(task_id))
        except SecretUnreadable as exc:
            log.error("task %s: a secret cannot be read to redact it: %s", task_id, exc)
            redactor = Redactor({})
        self._known[task_id] = (now + self.ttl_s, redactor)
        self._known.move_to_end(task_id)
        while len(self._known) > self.size:
            self._known.popitem(last=False)
        return redactor

    async def redact(self, event: Event) -> Event:
        if self.store is None:
            return event
        return (await self._redactor(event.task_id)).model(event)
