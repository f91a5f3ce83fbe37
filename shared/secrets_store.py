"""Tenants' secrets: kept in Redis encrypted with AES-256-GCM, and the one place that reads them.

A secret is a name and a value. Its value is written by the gateway (`PUT /v1/secrets/{name}`)
and read back only by the services that hand it to a task: the runtime, which puts a task's
secrets into its commands' environment, and the controller, which redacts them from the log.
No route of the API returns a value.

The key (`DECKHANDS_SECRETS_KEY`: 32 random bytes, URL-safe base64; on Kubernetes from the
Secret `deckhands-secrets-key`, with `make up` made once into `.run/credentials/secrets-key`)
never reaches Redis: a copy of Redis (its dump, its AOF, a replica) holds only ciphertexts. Each
value is sealed with a fresh 96-bit nonce, and with its tenant and name as associated data, so a
ciphertext copied under another tenant or name does not open. Every record names the key it was
sealed with (the first 8 bytes of the key's SHA-256): a key is rotated by giving the new one as
`DECKHANDS_SECRETS_KEY` and the old ones in `DECKHANDS_SECRETS_PREVIOUS_KEYS` (comma-separated)
until every secret was written again.

Redis keys (the `deckhands:` namespace):
- `deckhands:secrets:<tenant>`: hash, name -> the sealed record (JSON);
- `deckhands:task-secrets:<task>`: the secrets a task was created with (its tenant and their
  names: never the values), written by the gateway when it creates the task.

Redis is what every reader reads. The writer (the gateway) also keeps each record in a durable
store first (`durable`: the NATS key-value bucket SECRETS_BUCKET, as `secret.<tenant>.<name>`
and `grant.<task>`), from which a Redis that lost its data is filled again
(services/gateway/secret_records.py).

For other modules, the read side is:

    store = SecretsStore.from_settings(redis, settings)   # None: no key configured
    value = await store.read(tenant_id, "GITHUB_TOKEN")    # SecretNotFound if there is none
    values = await store.values_for_task(task_id)          # {name: value} the task may use
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict
from redis.asyncio import Redis

from .events import utc_now
from .settings import CommonSettings

__all__ = [
    "MAX_SECRETS_PER_TASK",
    "MAX_SECRETS_PER_TENANT",
    "MAX_SECRET_BYTES",
    "MIN_SECRET_CHARS",
    "SECRET_NAME_PATTERN",
    "SecretInfo",
    "SecretNotFound",
    "SecretUnreadable",
    "SecretsCipher",
    "SecretsDurable",
    "SecretsStore",
    "TaskSecretGrant",
    "bad_secret_name",
    "bad_secret_value",
    "new_secrets_key",
]

# A secret reaches a task as an environment variable of that name.
SECRET_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
_NAME = re.compile(SECRET_NAME_PATTERN)
# Variables that change how the sandbox's shell, Python, git, ssh or the programs they start
# run (what they load or execute, where they look, how they parse or trace): a secret may not
# set them. The runtime does not export a secret of such a name either, one stored before its
# name was reserved included (services/runtime/task_secrets.py). Names are compared upper-cased.
_RESERVED = frozenset(
    {
        # the shell, bash's own and POSIX ones
        "PATH",
        "HOME",
        "SHELL",
        "USER",
        "LOGNAME",
        "PWD",
        "OLDPWD",
        "CDPATH",
        "IFS",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "POSIXLY_CORRECT",
        "PS0",
        "PS1",
        "PS2",
        "PS3",
        "PS4",
        "PROMPT_COMMAND",
        "PROMPT_DIRTRIM",
        "GLOBIGNORE",
        "EXECIGNORE",
        "FIGNORE",
        "FUNCNEST",
        "SHLVL",
        "TMOUT",
        "TMPDIR",
        "OPTIND",
        "OPTARG",
        "OPTERR",
        "MAIL",
        "MAILPATH",
        "MAILCHECK",
        "HISTFILE",
        "HISTFILESIZE",
        "HISTSIZE",
        "HISTCONTROL",
        "HISTIGNORE",
        "HISTTIMEFORMAT",
        "HISTCMD",
        "INPUTRC",
        "EMACS",
        "TERM",
        "TERMINFO",
        "TERMINFO_DIRS",
        "TERMCAP",
        "COLUMNS",
        "LINES",
        "HOSTNAME",
        "UID",
        "EUID",
        "PPID",
        "GROUPS",
        "RANDOM",
        "SRANDOM",
        "SECONDS",
        "LINENO",
        "REPLY",
        # programs the shell and git start on their own
        "EDITOR",
        "VISUAL",
        "FCEDIT",
        "PAGER",
        "MANPAGER",
        "LESS",
        "LESSOPEN",
        "LESSCLOSE",
        "LESSKEY",
        "DISPLAY",
        # the C library: locales, modules it loads, name resolution, the allocator
        "LANG",
        "LANGUAGE",
        "LOCPATH",
        "NLSPATH",
        "GCONV_PATH",
        "GLIBC_TUNABLES",
        "TZ",
        "TZDIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "RES_OPTIONS",
        # other interpreters' start-up code and options
        "PERL5LIB",
        "PERL5OPT",
        "PERLLIB",
        "PERL5DB",
        "RUBYOPT",
        "RUBYLIB",
        "NODE_OPTIONS",
        "NODE_PATH",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
        # which certificates TLS trusts (git, pip, curl, Python)
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
    }
)
_RESERVED_PREFIXES = (
    "DECKHANDS_",  # the system's own
    "BASH_",  # BASH_ENV, BASH_XTRACEFD, BASH_FUNC_*, BASH_COMPAT, ...
    "COMP_",  # bash's completion
    "READLINE_",
    "LC_",  # locale categories
    "LD_",  # the dynamic linker: LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, ...
    "MALLOC_",  # glibc's allocator
    "PYTHON",  # PYTHONSTARTUP, PYTHONPATH, PYTHONHOME, PYTHONINSPECT, PYTHONWARNINGS, ...
    "GIT_",  # GIT_SSH_COMMAND, GIT_EXEC_PATH, GIT_CONFIG_*, GIT_DIR, GIT_ASKPASS, ...
    "SSH_",  # SSH_ASKPASS, SSH_AUTH_SOCK, ...
    "XDG_",  # XDG_CONFIG_HOME: where git (and others) read their configuration
    "OPENSSL_",  # OPENSSL_CONF loads engines
)
MAX_SECRET_BYTES = 32 << 10  # an environment variable, and one token, key or certificate
MIN_SECRET_CHARS = 4  # a shorter value would be "redacted" out of ordinary output
MAX_SECRETS_PER_TENANT = 200
MAX_SECRETS_PER_TASK = 32

_PREFIX = "deckhands"
_KEY_BYTES = 32
_NONCE_BYTES = 12


class SecretNotFound(LookupError):
    def __init__(self, tenant_id: str, name: str) -> None:
        super().__init__(f"tenant {tenant_id!r} has no secret {name!r}")
        self.tenant_id = tenant_id
        self.name = name


class SecretUnreadable(RuntimeError):
    """A stored secret that none of the configured keys opens (a lost or wrong key)."""


def bad_secret_name(name: str) -> str | None:
    """Why `name` cannot name a secret; None if it can."""
    if not _NAME.fullmatch(name):
        return (
            f"secret name {name!r} is not an environment variable name "
            "(letters, digits and _, not starting with a digit, at most 128 characters)"
        )
    upper = name.upper()
    prefix = next((p for p in _RESERVED_PREFIXES if upper.startswith(p)), None)
    if upper in _RESERVED or prefix is not None:
        which = f"variables starting with {prefix} change" if prefix else f"{upper} changes"
        return (
            f"secret name {name!r} is reserved: {which} how the sandbox's shell, Python, git, "
            "ssh or the programs they start run, so no secret may set it; choose another name"
        )
    return None


def bad_secret_value(value: str) -> str | None:
    """Why `value` cannot be a secret's value; None if it can."""
    if len(value) < MIN_SECRET_CHARS:
        return f"a secret's value has at least {MIN_SECRET_CHARS} characters"
    if len(value.encode()) > MAX_SECRET_BYTES:
        return f"a secret's value has at most {MAX_SECRET_BYTES} bytes"
    if "\x00" in value:
        return (
            "a secret's value cannot contain a NUL character (it becomes an environment variable)"
        )
    return None


def new_secrets_key() -> str:
    """A new DECKHANDS_SECRETS_KEY: 32 random bytes, URL-safe base64."""
    return base64.urlsafe_b64encode(os.urandom(_KEY_BYTES)).decode()


def _key_bytes(text: str, what: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text.strip().encode() + b"=" * (-len(text.strip()) % 4))
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != _KEY_BYTES:
        raise ValueError(
            f"{what} must be {_KEY_BYTES} random bytes in URL-safe base64 (44 characters; "
            'make one with: python -c "import base64,os; '
            'print(base64.urlsafe_b64encode(os.urandom(32)).decode())")'
        )
    return raw


def _key_id(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:16]


class SecretsCipher:
    """Seals and opens secret values; the first key seals, any of them opens."""

    def __init__(self, key: bytes, previous: Iterable[bytes] = ()) -> None:
        self._sealing = (_key_id(key), AESGCM(key))
        self._keys = {_key_id(k): AESGCM(k) for k in (*previous, key)}

    @classmethod
    def from_text(cls, key: str, previous: str = "") -> SecretsCipher:
        """From DECKHANDS_SECRETS_KEY and DECKHANDS_SECRETS_PREVIOUS_KEYS; ValueError naming the
        setting when one is malformed."""
        return cls(
            _key_bytes(key, "DECKHANDS_SECRETS_KEY"),
            [
                _key_bytes(k, "each of DECKHANDS_SECRETS_PREVIOUS_KEYS")
                for k in previous.split(",")
                if k.strip()
            ],
        )

    @staticmethod
    def _bound_to(tenant_id: str, name: str) -> bytes:
        return f"deckhands-secret\x1f{tenant_id}\x1f{name}".encode()

    def seal(self, tenant_id: str, name: str, value: str) -> tuple[str, str]:
        """(key id, base64 of nonce + ciphertext)."""
        key_id, aead = self._sealing
        nonce = os.urandom(_NONCE_BYTES)
        sealed = aead.encrypt(nonce, value.encode(), self._bound_to(tenant_id, name))
        return key_id, base64.b64encode(nonce + sealed).decode()

    def open(self, tenant_id: str, name: str, key_id: str, sealed: str) -> str:
        aead = self._keys.get(key_id)
        if aead is None:
            raise SecretUnreadable(
                f"secret {name!r} of tenant {tenant_id!r} was sealed with a key that is not "
                "configured (DECKHANDS_SECRETS_KEY / DECKHANDS_SECRETS_PREVIOUS_KEYS)"
            )
        raw = base64.b64decode(sealed)
        try:
            plain = aead.decrypt(
                raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._bound_to(tenant_id, name)
            )
        except InvalidTag:
            raise SecretUnreadable(
                f"secret {name!r} of tenant {tenant_id!r} does not open (altered, or moved)"
            ) from None
        return plain.decode()


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    sealed: str
    created_at: datetime
    updated_at: datetime


class SecretInfo(BaseModel):
    """What may be shown of a secret: never its value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    created_at: datetime
    updated_at: datetime


class TaskSecretGrant(BaseModel):
    """The secrets a task may use: its tenant's, by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    names: tuple[str, ...]


class SecretsDurable(Protocol):
    """Where the writer keeps every record too (key `secret.<tenant>.<name>` or `grant.<task>`,
    the same JSON as in Redis): what a Redis that lost its data is filled from."""

    async def put(self, key: str, value: bytes) -> None: ...

    async def delete(self, key: str) -> None: ...


@dataclass
class SecretsStore:
    redis: Redis
    cipher: SecretsCipher
    prefix: str = _PREFIX
    durable: SecretsDurable | None = None  # the gateway's; readers have none

    @classmethod
    def from_settings(cls, redis: Redis, settings: CommonSettings) -> SecretsStore | None:
        """The store, or None when no DECKHANDS_SECRETS_KEY is configured (secrets are off).
        A malformed key raises ValueError naming the setting."""
        key = settings.secrets_key.get_secret_value()
        if not key:
            return None
        return cls(
            redis,
            SecretsCipher.from_text(key, settings.secrets_previous_keys.get_secret_value()),
        )

    def _tenant_key(self, tenant_id: str) -> str:
        return f"{self.prefix}:secrets:{tenant_id}"

    def _grant_key(self, task_id: str) -> str:
        return f"{self.prefix}:task-secrets:{task_id}"

    # -- the tenant's own (the gateway)

    async def put(self, tenant_id: str, name: str, value: str) -> tuple[SecretInfo, bool]:
        """Set a secret; (what may be shown of it, whether it is new)."""
        key = self._tenant_key(tenant_id)
        now = utc_now()
        raw = await self.redis.hget(key, name)
        created_at = now if raw is None else _Record.model_validate_json(raw).created_at
        key_id, sealed = self.cipher.seal(tenant_id, name, value)
        record = _Record(key_id=key_id, sealed=sealed, created_at=created_at, updated_at=now)
        raw_record = record.model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"secret.{tenant_id}.{name}", raw_record.encode())
        await self.redis.hset(key, name, raw_record)
        return SecretInfo(name=name, created_at=created_at, updated_at=now), raw is None

    async def count(self, tenant_id: str) -> int:
        return int(await self.redis.hlen(self._tenant_key(tenant_id)))

    async def exists(self, tenant_id: str, name: str) -> bool:
        return bool(await self.redis.hexists(self._tenant_key(tenant_id), name))

    async def names(self, tenant_id: str) -> list[SecretInfo]:
        """The tenant's secrets by name, without their values."""
        raw = await self.redis.hgetall(self._tenant_key(tenant_id))
        infos = []
        for name, value in raw.items():
            record = _Record.model_validate_json(value)
            infos.append(
                SecretInfo(
                    name=_text(name), created_at=record.created_at, updated_at=record.updated_at
                )
            )
        return sorted(infos, key=lambda info: info.name)

    async def delete(self, tenant_id: str, name: str) -> bool:
        if self.durable is not None:
            await self.durable.delete(f"secret.{tenant_id}.{name}")
        return bool(await self.redis.hdel(self._tenant_key(tenant_id), name))

    async def missing(self, tenant_id: str, names: Iterable[str]) -> list[str]:
        """Those of `names` the tenant has no secret of."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return []
        found = await self.redis.hmget(self._tenant_key(tenant_id), wanted)
        return [name for name, raw in zip(wanted, found, strict=True) if raw is None]

    # -- reading values (the runtime, the controller, a checkout)

    async def read(self, tenant_id: str, name: str) -> str:
        """A secret's value; SecretNotFound if the tenant has none of that name."""
        raw = await self.redis.hget(self._tenant_key(tenant_id), name)
        if raw is None:
            raise SecretNotFound(tenant_id, name)
        record = _Record.model_validate_json(raw)
        return self.cipher.open(tenant_id, name, record.key_id, record.sealed)

    async def read_many(self, tenant_id: str, names: Iterable[str]) -> dict[str, str]:
        """The values of those of `names` the tenant has (a deleted one is left out)."""
        wanted = list(dict.fromkeys(names))
        if not wanted:
            return {}
        found = await self.redis.hmget(self._tenant_key(tenant_id), wanted)
        values = {}
        for name, raw in zip(wanted, found, strict=True):
            if raw is not None:
                record = _Record.model_validate_json(raw)
                values[name] = self.cipher.open(tenant_id, name, record.key_id, record.sealed)
        return values

    # -- which secrets a task may use

    async def grant(self, task_id: str, tenant_id: str, names: Iterable[str]) -> None:
        """Let the task use these secrets of its tenant (set when the task is created)."""
        grant = TaskSecretGrant(tenant_id=tenant_id, names=tuple(dict.fromkeys(names)))
        raw = grant.model_dump_json()
        if self.durable is not None:
            await self.durable.put(f"grant.{task_id}", raw.encode())
        await self.redis.set(self._grant_key(task_id), raw)

    async def grant_of(self, task_id: str) -> TaskSecretGrant | None:
        raw = await self.redis.get(self._grant_key(task_id))
        return None if raw is None else TaskSecretGrant.model_validate_json(raw)

    async def values_for_task(self, task_id: str) -> dict[str, str]:
        """{name: value} of the secrets the task may use and its tenant still has."""
        grant = await self.grant_of(task_id)
        if grant is None or not grant.names:
            return {}
        return await self.read_many(grant.tenant_id, grant.names)

    async def forget_task(self, task_id: str) -> None:
        if self.durable is not None:
            await self.durable.delete(f"grant.{task_id}")
        await self.redis.delete(self._grant_key(task_id))

    # -- filling a Redis that lost its data (the gateway, from `durable`)

    async def restore(self, key: str, value: bytes) -> bool:
        """Put back one durable record unless Redis has one (a newer write wins); whether it
        was missing."""
        kind, _, rest = key.partition(".")
        if kind == "secret":
            tenant_id, _, name = rest.partition(".")
            return bool(await self.redis.hsetnx(self._tenant_key(tenant_id), name, value))
        if kind == "grant":
            return bool(await self.redis.set(self._grant_key(rest), value, nx=True))
        return False


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
