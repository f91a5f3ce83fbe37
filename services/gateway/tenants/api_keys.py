"""API keys: their format, how one is made, and the hash under which it is stored.

A key reads `dh_<id>_<secret>`: `id` is 12 hex characters that name the key (its *prefix*,
`dh_<id>`, is what lists show and what revocation takes), `secret` is 32 random bytes,
URL-safe base64. Only the SHA-256 of the whole key is stored. A fast hash is enough, unlike for
passwords: the secret is 256 random bits, so a stolen hash cannot be reversed by guessing, and
every request is authenticated by one hash and one Redis lookup rather than a deliberately slow
key-derivation function.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

__all__ = [
    "KEY_PREFIX_PATTERN",
    "IssuedKey",
    "hash_api_key",
    "issue_api_key",
    "key_prefix_of",
    "same_secret",
]

_SCHEME = "dh"
_ID_HEX_CHARS = 12
_SECRET_BYTES = 32
# token_urlsafe(32) is 43 characters of [A-Za-z0-9_-]; anything else is not one of our keys.
_KEY = re.compile(rf"^{_SCHEME}_([0-9a-f]{{{_ID_HEX_CHARS}}})_[A-Za-z0-9_-]{{43}}$")
KEY_PREFIX_PATTERN = rf"^{_SCHEME}_[0-9a-f]{{{_ID_HEX_CHARS}}}$"


@dataclass(frozen=True)
class IssuedKey:
    """A new key: `key` is shown once to its owner, `key_hash` is what is kept."""

    key: str
    prefix: str
    key_hash: str


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def issue_api_key() -> IssuedKey:
    key_id = secrets.token_hex(_ID_HEX_CHARS // 2)
    key = f"{_SCHEME}_{key_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"
    return IssuedKey(key=key, prefix=f"{_SCHEME}_{key_id}", key_hash=hash_api_key(key))


def key_prefix_of(key: str) -> str | None:
    """The prefix of a well-formed key; None for anything that cannot be one of ours (so a
    malformed bearer costs no lookup)."""
    match = _KEY.fullmatch(key)
    return None if match is None else f"{_SCHEME}_{match.group(1)}"


def same_secret(given: str, expected: str) -> bool:
    """Compare secrets in constant time, so the answer's timing tells nothing of the key."""
    return hmac.compare_digest(given.encode(), expected.encode())
