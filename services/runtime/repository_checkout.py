"""A task's repository, checked out into its sandbox once, before its first action.

The fetch runs in the runtime's own process (checkout.py); its git directory goes into the
sandbox's /workspace through Docker's archive API, and the tree is checked out by git in a
helper container (workspace_helper.py), never in the runtime's process. The repository's
instructions (AGENTS.md and the like) are recorded, redacted, for the prompt; an uploaded tree's
are recorded the same way (workspace_ops.py).
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path

from shared.workspace import RepositoryRecords, RepositorySpec

from .checkout import fetch, tar_git_dir
from .containers import DockerSandboxes, Sandbox
from .errors import CheckoutFailed, HelperTimeout
from .settings import RuntimeSettings
from .task_facts import TaskFacts
from .task_secrets import TaskSecrets
from .workspace_files import put_archive
from .workspace_git import checkout_script, parse_instructions
from .workspace_helper import run_helper

__all__ = ["RepositoryCheckout"]

log = logging.getLogger("deckhands.runtime.workspace")


class RepositoryCheckout:
    def __init__(
        self,
        records: RepositoryRecords,
        secrets: TaskSecrets,
        docker: DockerSandboxes,
        settings: RuntimeSettings,
    ) -> None:
        self.records = records
        self.secrets = secrets
        self.docker = docker
        self.settings = settings
        # The task's repository is set at its creation: read once per task, not per action.
        self._repositories: TaskFacts[tuple[RepositorySpec, str]] = TaskFacts(records.get)
        # One checkout per task at a time (its prepare and first action may race); a lock
        # nobody holds or waits for goes away by itself.
        self._checkouts: weakref.WeakValueDictionary[str, asyncio.Lock] = (
            weakref.WeakValueDictionary()
        )
        # Told of a task's first checkout, before the lock is let go (so before any action
        # runs): the runtime's checkpoint of the workspace the task was created with.
        self.checked_out: Callable[[str, str | None, Sandbox], None] | None = None

    async def forget(self, task_id: str) -> None:
        """A deleted task: what its checkout recorded goes (its commit, its instructions)."""
        await self.records.forget_checkout(task_id)

    async def ensure(self, task_id: str, sandbox: Sandbox) -> None:
        """Check the task's repository out into its sandbox, once, before its first action.
        CheckoutFailed says why it could not be."""
        found = await self._repositories.get(task_id)
        if found is None:
            return
        lock = self._checkouts.get(task_id)
        if lock is None:
            lock = self._checkouts[task_id] = asyncio.Lock()
        async with lock:
            done = await self.records.checked_out(task_id)
            if done is not None and done.split(":", 1)[0] == sandbox.container_id:
                return
            spec, tenant_id = found
            started = time.monotonic()
            token = await self._token(tenant_id, spec.token_secret)
            s = self.settings
            with tempfile.TemporaryDirectory(prefix="deckhands-clone-") as tmp:
                fetched = await fetch(
                    spec,
                    token,
                    Path(tmp),
                    schemes=s.repository_url_schemes,
                    timeout_s=s.repository_clone_timeout_s,
                    max_bytes=s.repository_max_bytes,
                    allowed_hosts=s.repository_allowed_hosts,
                )
                archive = Path(tmp) / "git.tar"
                await asyncio.to_thread(tar_git_dir, fetched.git_dir, archive)
                await put_archive(self.docker, sandbox.container_id, archive)
            with tempfile.TemporaryFile() as out:
                try:
                    result = await run_helper(
                        self.docker,
                        sandbox.container_id,
                        checkout_script(s.instructions_max_bytes),
                        out=out,
                        max_out=s.instructions_max_bytes + 4096,
                        timeout_s=s.repository_clone_timeout_s,
                        writable=True,
                    )
                except HelperTimeout as exc:
                    raise CheckoutFailed(f"checking the tree out: {exc}") from None
                if result.exit_code != 0:
                    # What git said names the repository's files: the log has it, the task's
                    # reason says what failed.
                    log.warning(
                        "task %s: checking the tree out failed (exit %s): %s",
                        task_id,
                        result.exit_code,
                        " ".join(result.stderr.split())[-500:],
                    )
                    raise CheckoutFailed(
                        f"checking the repository's tree out failed (exit {result.exit_code})"
                    )
                out.seek(0)
                await self.record_instructions(task_id, out.read())
            await self.records.mark_checked_out(task_id, f"{sandbox.container_id}:{fetched.commit}")
            if done is None and self.checked_out is not None:
                self.checked_out(task_id, tenant_id, sandbox)
            log.info(
                "task %s: checked out %s at %s in %.1fs",
                task_id,
                spec.url,
                fetched.commit[:12],
                time.monotonic() - started,
            )

    async def _token(self, tenant_id: str, name: str | None) -> str | None:
        if name is None:
            return None
        if self.secrets.store is None:
            raise CheckoutFailed(
                f"token_secret {name!r} cannot be read: secrets are off on this runtime "
                "(DECKHANDS_SECRETS_KEY)"
            )
        try:
            return await self.secrets.store.read(tenant_id, name)
        except LookupError:
            raise CheckoutFailed(f"the tenant has no secret {name!r} (token_secret)") from None

    async def record_instructions(self, task_id: str, out: bytes) -> None:
        """Keep the instructions a checkout or an upload's baseline found (`out`: the helper's
        output) for the task's prompt."""
        found = parse_instructions(out)
        if found is None:
            return
        path, text = found
        # They join the prompt: a secret a command wrote into the file is redacted here, at
        # the source (what the bound on the read cut through at the end, too).
        redactor = await self.secrets.redactor(task_id)
        cut = len(out.partition(b"\n")[2]) >= self.settings.instructions_max_bytes
        await self.records.put_instructions(task_id, path, redactor.text(text, cut_end=cut))
