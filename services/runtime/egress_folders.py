"""The runtime's end of the egress proxy (issue 27): a folder per sandbox with a network policy.

A task with a policy gets a sandbox with no network at all. The runtime makes a folder for it
(under DECKHANDS_EGRESS_DIR, or under DECKHANDS_EGRESS_ENGINE_DIR on the engine's host:
egress_stores.py), writes there whose it is and its policy (policy.json), and mounts the folder
read-only at /run/deckhands/egress; each egress proxy replica listens on a socket in it
(services/egress/sockets.py), and the sandbox's relay (deploy/sandbox/egress_relay.py) carries
127.0.0.1:3128 there. The folder is the sandbox's identity for the proxy: only the runtime
writes it, and the sandbox sees only its own.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import AfterValidator

from shared.commands import ExecuteAction
from shared.egress_policy import (
    SANDBOX_CA_BUNDLE,
    SANDBOX_EGRESS_CA,
    SANDBOX_EGRESS_FILE,
    SANDBOX_EGRESS_MOUNT,
    SANDBOX_PROXY_PORT,
    SandboxEgress,
)

from .egress_stores import VALID_TOKEN, EngineFolders, FolderStore, LocalFolders
from .errors import SandboxStartError

if TYPE_CHECKING:
    from .settings import RuntimeSettings

__all__ = ["CaCertPath", "EgressFolders", "egress_folders", "proxy_environment"]

log = logging.getLogger("deckhands.runtime.egress")


def _ca_cert(path: str | None) -> str | None:
    """DECKHANDS_EGRESS_CA_CERT: a readable certificate, and no key (the proxy's alone)."""
    if not path:
        return None
    try:
        pem = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"DECKHANDS_EGRESS_CA_CERT {path!r} cannot be read: {exc}") from None
    if not pem:
        return None  # an empty file is none (the Kubernetes Secret as shipped)
    if b"BEGIN CERTIFICATE" not in pem:
        raise ValueError(f"DECKHANDS_EGRESS_CA_CERT {path!r} holds no PEM certificate")
    if b"PRIVATE KEY" in pem:
        raise ValueError(
            f"DECKHANDS_EGRESS_CA_CERT {path!r} holds a private key: give the runtime the "
            "certificate only (the key is the egress proxy's)"
        )
    return path


CaCertPath = Annotated[str | None, AfterValidator(_ca_cert)]


def proxy_environment() -> dict[str, str]:
    """What pip, npm, git and curl read to go through the proxy (both spellings are in use)."""
    proxy = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"
    local = "localhost,127.0.0.1,::1"
    env = {"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "NO_PROXY": local}
    return env | {k.lower(): v for k, v in env.items()}


class EgressFolders:
    """The egress side of a sandbox's life: its folder made before it starts, the policy of
    each action and of the time between actions written there, the folder removed with it.
    `store` keeps the folders (egress_stores.py); None: this runtime has no egress proxy."""

    def __init__(self, store: FolderStore | None, ca_cert: str | None = None) -> None:
        self.store = store
        # Checked by the settings (CaCertPath): a certificate, no key.
        self.ca_cert = Path(ca_cert).read_bytes() if ca_cert else None

    def environment(self) -> dict[str, str]:
        """A sandbox with a policy's variables: the proxy, and the CA's bundle if there is one."""
        env = proxy_environment()
        if self.ca_cert is not None:
            # The system's bundle and the egress CA, written by the sandbox's holder as it
            # starts (its root is read-only); each tool's own variable, Node's takes the CA.
            bundle = {
                name: SANDBOX_CA_BUNDLE
                for name in (
                    "SSL_CERT_FILE",
                    "REQUESTS_CA_BUNDLE",
                    "PIP_CERT",
                    "CURL_CA_BUNDLE",
                    "GIT_SSL_CAINFO",
                )
            }
            env |= bundle | {"NODE_EXTRA_CA_CERTS": f"{SANDBOX_EGRESS_MOUNT}/{SANDBOX_EGRESS_CA}"}
        return env

    async def make(self, egress: SandboxEgress) -> tuple[str, str]:
        """A new folder for a sandbox of `egress`'s task: (its token, its path on the host)."""
        if self.store is None:
            raise SandboxStartError(
                "this task has a network policy, but this runtime has no egress proxy "
                "(neither DECKHANDS_EGRESS_DIR nor DECKHANDS_EGRESS_ENGINE_DIR is set)"
            )
        token = "sbx-" + secrets.token_hex(8)
        files = {SANDBOX_EGRESS_CA: self.ca_cert} if self.ca_cert is not None else {}
        try:
            # The policy last: its presence is what the proxy listens for.
            await self.store.make(token, files | {SANDBOX_EGRESS_FILE: _policy(egress)})
        except OSError as exc:
            await self.remove(token)
            raise SandboxStartError(f"cannot make the sandbox's egress folder: {exc}") from exc
        return token, self.store.path(token)

    async def refresh(self, token: str | None, egress: SandboxEgress) -> bool:
        """Write the task's policy again if it changed (a user's message widened it): the
        proxy reads it for the sandbox's next connection. True if it was rewritten."""
        if self.store is None or not token or not VALID_TOKEN.match(token):
            return False
        policy = _policy(egress)
        if await self.store.read(token, SANDBOX_EGRESS_FILE) == policy:
            return False
        await self.store.write(token, SANDBOX_EGRESS_FILE, policy)
        return True

    async def between_actions(self, token: str | None, order: ExecuteAction) -> None:
        """Once an action ended, a sandbox with a policy reaches only what the task's
        `between_actions` names (by default nothing) until the next action writes its own: a
        process the agent left running in the background has its new connections elsewhere
        refused and those the action left open cut by the proxy (issue 27, item 6). Before
        each action the runtime writes the action's scope, else the task's policy
        (execution.py)."""
        if order.network is None or not token:
            return
        background = order.network.background()
        await self.refresh(
            token,
            SandboxEgress(task_id=order.task_id, tenant_id=order.tenant_id, network=background),
        )

    async def remove(self, token: str | None) -> None:
        if self.store is None or not token:
            return
        try:
            await self.store.remove(token)
        except (OSError, ValueError) as exc:  # the sweep takes it later
            log.warning("could not remove egress folder %s: %s", token, exc)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()

    async def sweep(self, live: set[str], min_age_s: float = 60.0) -> int:
        """Remove the folders of sandboxes that no longer exist (a crash between removing one
        and its folder); a folder younger than `min_age_s` may be one being started."""
        if self.store is None:
            return 0
        return await self.store.sweep(live, min_age_s)


def _policy(egress: SandboxEgress) -> bytes:
    return egress.model_dump_json().encode()


def egress_folders(
    settings: RuntimeSettings,
    call: Callable[..., Awaitable[Any]],
    api: Callable[[], Any],
    replica: str,
) -> EgressFolders:
    """This runtime's, kept where its settings say (`call` and `api`: its Docker threads and
    client, for folders on the engine's host)."""
    store: FolderStore | None = None
    if settings.egress_dir:
        store = LocalFolders(settings.egress_dir)
    elif settings.egress_engine_dir:
        store = EngineFolders(
            call,
            api,
            settings.egress_engine_dir,
            settings.sandbox_image,
            settings.egress_folder_owner,
            settings.pool_name,
            replica,
        )
    return EgressFolders(store, settings.egress_ca_cert)
