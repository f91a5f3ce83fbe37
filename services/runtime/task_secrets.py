"""A task's secrets in the runtime: read from the store by task (with the runtime's own Redis
credentials, so no value ever travels in a NATS message), put into each of the task's commands'
environment, and redacted from everything the runtime hands back.

The values reach the sandbox through the executor's private channel only, beside the command,
never in it: each `bash` and `python` request of the task carries them as its `env`, which the
executor exports into the shell (through a file of its own that a fixed prelude reads with
tracing off, so `set -x`, `set -v` or a DEBUG trap in the agent's shell never print a value:
deploy/sandbox/executor/bash.py, `BashSession`) or puts into the Python process's `os.environ`. A
shell that restarted, a new sandbox, a secret updated meanwhile: the next command has the
current values.

A secret whose name is reserved (shared/secrets_store.py, `bad_secret_name`: a variable that
changes how the shell, Python, git or ssh runs) is never exported, even one stored before its
name was reserved; its value is still redacted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from shared.secret_redaction import Redactor
from shared.secrets_store import SecretsStore, SecretUnreadable, StoredSecret, bad_secret_name

from .task_facts import TaskFacts

__all__ = ["TaskSecrets", "exported"]

log = logging.getLogger("deckhands.runtime.secrets")


def exported(env: Mapping[str, str]) -> dict[str, str]:
    """The secrets a command gets in its environment: all of `env` but reserved names."""
    allowed = {name: value for name, value in env.items() if bad_secret_name(name) is None}
    if len(allowed) < len(env):
        log.warning(
            "secrets with reserved names are not exported: %s",
            ", ".join(sorted(set(env) - set(allowed))),
        )
    return allowed


class TaskSecrets:
    def __init__(self, store: SecretsStore | None) -> None:
        self.store = store
        # Which secrets a task may use is set once, at its creation; their values are read
        # for every action (a secret updated meanwhile: the next command has its new value).
        self._grants = TaskFacts(store.grant_of) if store is not None else None

    async def _stored(self, task_id: str) -> list[StoredSecret]:
        """The secrets the task may use; [] when it has none (no Redis read once its grant is
        known) or secrets are off here. A value no configured key opens is left out, with an
        error in the log naming it (never its value)."""
        if self.store is None or self._grants is None:
            return []
        try:
            grant = await self._grants.get(task_id)
            if grant is None or not grant.names:
                return []
            return await self.store.read_stored(grant.tenant_id, grant.names)
        except SecretUnreadable as exc:
            log.error("task %s: a secret cannot be read: %s", task_id, exc)
            return []

    async def of(self, task_id: str) -> dict[str, str]:
        """{name: value} of the secrets the task's commands get in their environment: not
        those bound to hosts, which only the egress proxy adds to requests to those hosts."""
        return {s.name: s.value for s in await self._stored(task_id) if s.egress is None}

    async def for_action(self, task_id: str) -> tuple[dict[str, str], Redactor]:
        """One read for an action: its environment's secrets, and the Redactor of them all."""
        stored = await self._stored(task_id)
        env = {s.name: s.value for s in stored if s.egress is None}
        return env, Redactor({s.name: s.value for s in stored})

    async def redactor(self, task_id: str) -> Redactor:
        """The Redactor of every secret of the task, bound ones too (a host that echoes one
        back), or one that changes nothing when it has none."""
        return Redactor({s.name: s.value for s in await self._stored(task_id)})

    def forget(self, task_id: str) -> None:
        if self._grants is not None:
            self._grants.forget(task_id)
