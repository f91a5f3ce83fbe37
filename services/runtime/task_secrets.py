"""A task's secrets in the runtime: read from the store by task (with the runtime's own Redis
credentials, so no value ever travels in a NATS message), exported into each of the task's
commands, and redacted from everything the runtime hands back.

The values reach the sandbox through the executor's private channel only: each command of the
task runs after an `export NAME='value' ...` line the runtime puts in front of it (the command
shown in events is the agent's own), and each Python cell after a cell of the runtime's that
sets them in `os.environ`. A shell that restarted, a new sandbox, a secret updated
meanwhile: the next command has the current values.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Mapping

from shared.secrets_store import SecretsStore, SecretUnreadable

from .task_facts import TaskFacts

__all__ = ["TaskSecrets", "python_exports", "with_exports"]

log = logging.getLogger("deckhands.runtime.secrets")


def with_exports(command: str, env: Mapping[str, str]) -> str:
    """`command` preceded by a line exporting `env` (names are environment variable names,
    checked when they were stored; values single-quoted, which keeps any character but NUL)."""
    if not env:
        return command
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(env.items()))
    return f"export {exports}\n{command}"


def python_exports(env: Mapping[str, str]) -> str:
    """A Python cell that puts `env` into the Python session's environment (its cells and
    the processes they start): `repr` of a dict of strings is a literal, nothing in it runs."""
    return f"import os as _dh_os; _dh_os.environ.update({dict(env)!r}); del _dh_os"


class TaskSecrets:
    def __init__(self, store: SecretsStore | None) -> None:
        self.store = store
        # Which secrets a task may use is set once, at its creation; their values are read
        # for every action (a secret updated meanwhile: the next command has its new value).
        self._grants = TaskFacts(store.grant_of) if store is not None else None

    async def of(self, task_id: str) -> dict[str, str]:
        """{name: value} of the secrets the task may use; {} when it has none (no Redis read
        once its grant is known) or secrets are off here. A value no configured key opens is
        left out, with an error in the log naming it (never its value)."""
        if self.store is None or self._grants is None:
            return {}
        try:
            grant = await self._grants.get(task_id)
            if grant is None or not grant.names:
                return {}
            return await self.store.read_many(grant.tenant_id, grant.names)
        except SecretUnreadable as exc:
            log.error("task %s: a secret cannot be read: %s", task_id, exc)
            return {}

    def forget(self, task_id: str) -> None:
        if self._grants is not None:
            self._grants.forget(task_id)
