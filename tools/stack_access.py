"""How to get into the local stack: the credentials of its NATS and Redis users, the gateway's
admin key and an API key of the stack's tenant, the key that seals tenants' secrets, and the
environment each process of the stack starts with.
"""

from __future__ import annotations

import os
from typing import Any

from .api_access import (
    auth_headers,
    issue_key,
    key_works,
    new_admin_key,
    read_secret,
    write_secret,
)
from .credentials import Credentials, ensure_credentials
from .stack_config import StackConfig

__all__ = ["SCOPED_ENV", "StackAccess"]

# Credentials only the services named beside them get (deploy/k8s gives them the same way): a
# process that is broken into holds no key it does not use.
SCOPED_ENV = {
    "DECKHANDS_ADMIN_API_KEY": ("gateway",),
    "DECKHANDS_SECRETS_KEY": ("gateway", "controller", "runtime", "egress"),
    "DECKHANDS_SECRETS_PREVIOUS_KEYS": ("gateway", "controller", "runtime", "egress"),
    # The egress CA's private key: the proxy's alone (the runtime gets the certificate).
    "DECKHANDS_EGRESS_CA_FILE": ("egress",),
    "DECKHANDS_LLM_API_KEY": ("reasoner",),
}


class StackAccess:
    """The keys and credentials of a stack (under its run_dir), and the environment they make."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self.api_key_file = config.run_dir / "api_key"
        self.admin_key_file = config.run_dir / "admin_api_key"
        self._credentials: Credentials | None = None

    @property
    def credentials(self) -> Credentials:
        """NATS and Redis passwords of every service and the admin (made on first use, kept in
        run_dir/credentials): the servers accept no one else."""
        if self._credentials is None:
            self._credentials = ensure_credentials(self.config.run_dir / "credentials")
        return self._credentials

    def nats_login(self, user: str = "admin") -> dict[str, Any]:
        """nats.connect keyword arguments: the servers and `user`'s credentials."""
        return {"servers": self.config.nats_url.split(","), **self.credentials.nats_login(user)}

    def redis_login(self, user: str = "admin") -> dict[str, Any]:
        """redis.Redis keyword arguments: the server and `user`'s credentials."""
        return {
            "host": "127.0.0.1",
            "port": self.config.redis_port,
            "username": user,
            "password": self.credentials.redis[user],
        }

    def given_admin_key(self) -> str | None:
        return self.config.extra_env.get("DECKHANDS_ADMIN_API_KEY") or os.environ.get(
            "DECKHANDS_ADMIN_API_KEY"
        )

    @property
    def admin_api_key(self) -> str:
        """The gateway's admin key: the one given in the environment, or the one `up` made."""
        key = self.given_admin_key() or read_secret(self.admin_key_file)
        if key is None:
            raise RuntimeError(f"no admin key: start the stack first ({self.admin_key_file})")
        return key

    @property
    def api_key(self) -> str:
        """An API key of the stack's tenant, made by `up`."""
        key = read_secret(self.api_key_file)
        if key is None:
            raise RuntimeError(f"no API key: start the stack first ({self.api_key_file})")
        return key

    @property
    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate as the stack's tenant."""
        return auth_headers(self.api_key)

    def secrets_key(self) -> str:
        """The key that encrypts tenants' secrets (DECKHANDS_SECRETS_KEY), made once and kept
        in run_dir/credentials/secrets-key: secrets stored by an earlier `up` stay readable."""
        path = self.config.run_dir / "credentials" / "secrets-key"
        key = read_secret(path)
        if key is None:
            from shared.secrets_cipher import new_secrets_key

            path.parent.mkdir(parents=True, exist_ok=True)
            key = new_secrets_key()
            write_secret(path, key)
        return key

    def _ensure_admin_key(self) -> bool:
        """Make an admin key unless one was given or made before; True if it made one."""
        if self.given_admin_key() or read_secret(self.admin_key_file):
            return False
        write_secret(self.admin_key_file, new_admin_key())
        return True

    def ensure_api_key(self) -> None:
        """Keep the tenant's key from an earlier `up` while the gateway accepts it (Redis keeps
        its data in run_dir), else make a new one."""
        gateway = self.config.gateway_url
        kept = read_secret(self.api_key_file)
        if kept is not None and key_works(gateway, kept):
            return
        key = issue_key(gateway, self.admin_api_key, self.config.tenant, name="tools.stack")
        write_secret(self.api_key_file, key)

    def _env(self) -> dict[str, str]:
        c = self.config
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "DECKHANDS_NATS_URL": c.nats_url,
            # Every server keeps a copy: the streams survive the loss of any one of three.
            "DECKHANDS_STREAM_REPLICAS": str(min(c.nats_nodes, 3)),
            "DECKHANDS_REDIS_URL": f"redis://127.0.0.1:{c.redis_port}/0",
            "DECKHANDS_HOST": "127.0.0.1",
            "DECKHANDS_PORT": str(c.gateway_port),
            "DECKHANDS_DATA_DIR": str(c.run_dir / "storage"),
            "DECKHANDS_POOL_NAME": c.pool_name,
            # The runtime's and the egress proxies' shared folder (services/egress).
            "DECKHANDS_EGRESS_DIR": str(c.egress_dir),
            # Several gateway processes serve one port (tools/stack_config.py, `gateways`).
            "DECKHANDS_REUSE_PORT": "true" if c.gateways > 1 else "false",
            **c.extra_env,
        }
        if not env.get("DECKHANDS_SECRETS_KEY"):
            env["DECKHANDS_SECRETS_KEY"] = self.secrets_key()
        if not env.get("DECKHANDS_EGRESS_CA_FILE"):
            # The deployment's egress CA, made once (secrets bound to hosts, issue 27).
            from .egress_ca import ensure_egress_ca

            ca_file, ca_cert = ensure_egress_ca(c.run_dir / "credentials")
            env["DECKHANDS_EGRESS_CA_FILE"] = str(ca_file)
            env.setdefault("DECKHANDS_EGRESS_CA_CERT", str(ca_cert))
        admin_key = self.given_admin_key() or read_secret(self.admin_key_file)
        if admin_key is not None:
            env["DECKHANDS_ADMIN_API_KEY"] = admin_key
        if not env.get("DECKHANDS_LLM_MODEL") and c.llm == "local":
            from .local_llm import llm_env

            env.update(llm_env(c.llm_port, env))
        elif not env.get("DECKHANDS_LLM_MODEL"):
            env.update(
                DECKHANDS_LLM_MODEL="openai/scripted",
                DECKHANDS_LLM_API_BASE=f"http://127.0.0.1:{c.llm_port}/v1",
                DECKHANDS_LLM_API_KEY="scripted-no-key",
            )
        return env
