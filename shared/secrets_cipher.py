"""Sealing a secret's value with AES-256-GCM, and opening it again, under a key that never
reaches Redis.

Each value is sealed with a fresh 96-bit nonce, and with its tenant and name as associated data,
so a ciphertext copied under another tenant or name does not open. Every record names the key it
was sealed with (the first 8 bytes of the key's SHA-256): the first key seals, any configured one
opens, which is how a key is rotated (shared/secrets_store.py).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["SecretUnreadable", "SecretsCipher", "new_secrets_key"]

_KEY_BYTES = 32
_NONCE_BYTES = 12


class SecretUnreadable(RuntimeError):
    """A stored secret that none of the configured keys opens (a lost or wrong key)."""


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
    def _bound_to(tenant_id: str, name: str, context: str) -> bytes:
        # `context`: what else the value is sealed to (a secret's egress binding, as JSON), so
        # that it cannot be changed in Redis without the value opening no more.
        bound = f"deckhands-secret\x1f{tenant_id}\x1f{name}"
        return (bound + f"\x1f{context}" if context else bound).encode()

    def seal(self, tenant_id: str, name: str, value: str, context: str = "") -> tuple[str, str]:
        """(key id, base64 of nonce + ciphertext)."""
        key_id, aead = self._sealing
        nonce = os.urandom(_NONCE_BYTES)
        sealed = aead.encrypt(nonce, value.encode(), self._bound_to(tenant_id, name, context))
        return key_id, base64.b64encode(nonce + sealed).decode()

    def open(self, tenant_id: str, name: str, key_id: str, sealed: str, context: str = "") -> str:
        aead = self._keys.get(key_id)
        if aead is None:
            raise SecretUnreadable(
                f"secret {name!r} of tenant {tenant_id!r} was sealed with a key that is not "
                "configured (DECKHANDS_SECRETS_KEY / DECKHANDS_SECRETS_PREVIOUS_KEYS)"
            )
        raw = base64.b64decode(sealed)
        try:
            plain = aead.decrypt(
                raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._bound_to(tenant_id, name, context)
            )
        except InvalidTag:
            raise SecretUnreadable(
                f"secret {name!r} of tenant {tenant_id!r} does not open (altered, or moved)"
            ) from None
        return plain.decode()
