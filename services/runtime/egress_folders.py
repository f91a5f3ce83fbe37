"""The runtime's end of the egress proxy (issue 27): a folder per sandbox with a network policy.

A task with a policy gets a sandbox with no network at all. The runtime makes a folder for it
under DECKHANDS_EGRESS_DIR, writes there whose it is and its policy (policy.json), and mounts
the folder read-only at /run/deckhands/egress; each egress proxy replica listens on a socket
in it (services/egress/sockets.py), and the sandbox's relay (deploy/sandbox/egress_relay.py)
carries 127.0.0.1:3128 there. The folder is the sandbox's identity for the proxy: only the
runtime writes it, and the sandbox sees only its own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Annotated

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

from .errors import SandboxStartError

__all__ = ["CaCertPath", "EgressFolders", "proxy_environment"]


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
    def __init__(self, root: str | None, ca_cert: str | None = None) -> None:
        self.root = Path(root) if root else None
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

    def make(self, egress: SandboxEgress) -> tuple[str, str]:
        """A new folder for a sandbox of `egress`'s task: (its token, its path on the host)."""
        if self.root is None:
            raise SandboxStartError(
                "this task has a network policy, but this runtime has no egress proxy "
                "(DECKHANDS_EGRESS_DIR is not set)"
            )
        token = "sbx-" + secrets.token_hex(8)
        folder = self.root / token
        folder.mkdir(mode=0o755, parents=True)
        folder.chmod(0o755)
        if self.ca_cert is not None:
            (folder / SANDBOX_EGRESS_CA).write_bytes(self.ca_cert)
            (folder / SANDBOX_EGRESS_CA).chmod(0o644)
        self._write(folder, egress)
        return token, str(folder)

    def refresh(self, token: str | None, egress: SandboxEgress) -> bool:
        """Write the task's policy again if it changed (a user's message widened it): the
        proxy reads it for the sandbox's next connection. True if it was rewritten."""
        if self.root is None or not token or "/" in token:
            return False
        folder = self.root / token
        try:
            if (
                SandboxEgress.model_validate_json((folder / SANDBOX_EGRESS_FILE).read_bytes())
                == egress
            ):
                return False
        except (OSError, ValueError):
            pass
        self._write(folder, egress)
        return True

    def between_actions(self, token: str | None, order: ExecuteAction) -> None:
        """Once an action ended, a sandbox with a policy reaches only what the task's
        `between_actions` names (by default nothing) until the next action writes its own: a
        process the agent left running in the background has its new connections elsewhere
        refused and those the action left open cut by the proxy (issue 27, item 6). Before
        each action the runtime writes the action's scope, else the task's policy
        (execution.py)."""
        if order.network is None or not token:
            return
        background = order.network.background()
        self.refresh(
            token,
            SandboxEgress(task_id=order.task_id, tenant_id=order.tenant_id, network=background),
        )

    @staticmethod
    def _write(folder: Path, egress: SandboxEgress) -> None:
        written = folder / (SANDBOX_EGRESS_FILE + ".new")
        written.write_text(egress.model_dump_json())
        written.chmod(0o644)
        # Whole or absent: a proxy replica reading the folder never sees half a policy.
        os.replace(written, folder / SANDBOX_EGRESS_FILE)

    def remove(self, token: str | None) -> None:
        if self.root is None or not token or "/" in token:
            return
        shutil.rmtree(self.root / token, ignore_errors=True)

    def sweep(self, live: set[str], min_age_s: float = 60.0) -> int:
        """Remove the folders of sandboxes that no longer exist (a crash between removing one
        and its folder); a folder younger than `min_age_s` may be one being started."""
        if self.root is None or not self.root.is_dir():
            return 0
        removed = 0
        now = time.time()
        for entry in self.root.iterdir():
            if not entry.name.startswith("sbx-") or entry.name in live:
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime >= min_age_s:
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
        return removed
