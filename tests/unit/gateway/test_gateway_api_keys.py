"""API keys: their format and hash (pure), and their lookup, listing and revocation in
TenantStore on a real redis-server; idempotency bindings per tenant."""

from __future__ import annotations

import hashlib

import pytest
from redis.asyncio import Redis

from services.gateway.api_keys import (
    hash_api_key,
    issue_api_key,
    key_prefix_of,
    same_secret,
)
from services.gateway.errors import (
    ApiKeyNotFound,
    IdempotencyConflict,
    TenantExists,
    TenantNotFound,
)
from services.gateway.idempotency import IdempotencyKeys, request_fingerprint
from services.gateway.tenants import TenantStore
from shared.events import new_id


def test_a_key_names_its_prefix_and_is_stored_as_its_sha256() -> None:
    issued = issue_api_key()
    assert issued.key.startswith(issued.prefix + "_")
    assert key_prefix_of(issued.key) == issued.prefix
    assert issued.key_hash == hashlib.sha256(issued.key.encode()).hexdigest()
    assert issued.key_hash == hash_api_key(issued.key)
    assert issued.key not in issued.key_hash
    # 256 random bits each time.
    assert len({issue_api_key().key for _ in range(50)}) == 50


def test_only_well_formed_keys_have_a_prefix() -> None:
    key = issue_api_key().key
    for bad in (
        "",
        "dh_",
        key[:-1],  # one character short
        key + "x",
        key.replace("dh_", "xx_", 1),
        key.upper(),
        "Bearer " + key,
        key[:16] + "!" + key[17:],
    ):
        assert key_prefix_of(bad) is None, bad


def test_secrets_compare_whole() -> None:
    assert same_secret("a" * 64, "a" * 64)
    assert not same_secret("a" * 64, "a" * 63)
    assert not same_secret("a" * 64, "a" * 63 + "b")


@pytest.fixture
def tenants(redis: Redis) -> TenantStore:
    # A prefix of the test's own: the tests share one redis-server.
    return TenantStore(redis, prefix=f"test-{new_id()}")


async def test_a_key_authenticates_as_its_tenant_until_revoked(tenants: TenantStore) -> None:
    await tenants.create_tenant("acme", "ACME")
    issued = await tenants.issue_key("acme", "ci")
    caller = await tenants.authenticate(issued.key)
    assert caller is not None
    assert (caller.tenant_id, caller.key_prefix) == ("acme", issued.record.prefix)

    revoked = await tenants.revoke_key("acme", issued.record.prefix)
    assert revoked.revoked_at is not None
    assert await tenants.authenticate(issued.key) is None
    # Revoking again changes nothing; the listing keeps the key, revoked.
    assert await tenants.revoke_key("acme", issued.record.prefix) == revoked
    [listed] = await tenants.list_keys("acme")
    assert listed.prefix == issued.record.prefix and listed.revoked_at == revoked.revoked_at


async def test_what_is_stored_never_holds_the_key(tenants: TenantStore, redis: Redis) -> None:
    await tenants.create_tenant("acme", "ACME")
    issued = await tenants.issue_key("acme", "")
    stored = b""
    async for name in redis.scan_iter(f"{tenants.prefix}:*"):
        stored += name
        kind = await redis.type(name)
        if kind == b"string":
            stored += await redis.get(name) or b""
        elif kind == b"zset":
            stored += b"".join(await redis.zrange(name, 0, -1))
    assert issued.key.encode() not in stored
    assert issued.key.split("_", 2)[2].encode() not in stored  # nor its secret part
    assert issued.record.key_hash.encode() in stored


async def test_unknown_malformed_and_other_keys_do_not_authenticate(
    tenants: TenantStore,
) -> None:
    await tenants.create_tenant("acme", "ACME")
    issued = await tenants.issue_key("acme", "")
    assert await tenants.authenticate(issue_api_key().key) is None  # well formed, never issued
    assert await tenants.authenticate("") is None
    assert await tenants.authenticate(issued.record.prefix) is None  # the prefix is no key
    assert await tenants.authenticate(issued.record.key_hash) is None  # nor is the hash
    # Same prefix, another secret.
    forged = issued.record.prefix + "_" + issue_api_key().key.split("_", 2)[2]
    assert await tenants.authenticate(forged) is None


async def test_tenants_and_their_keys(tenants: TenantStore) -> None:
    await tenants.create_tenant("acme", "ACME")
    await tenants.create_tenant("globex", "Globex")
    with pytest.raises(TenantExists):
        await tenants.create_tenant("acme", "again")
    assert [t.id for t in await tenants.list_tenants()] == ["acme", "globex"]
    assert (await tenants.get_tenant("globex")).name == "Globex"
    with pytest.raises(TenantNotFound):
        await tenants.get_tenant("initech")
    with pytest.raises(TenantNotFound):
        await tenants.issue_key("initech", "")

    first = await tenants.issue_key("acme", "first")
    second = await tenants.issue_key("acme", "second")
    assert [k.name for k in await tenants.list_keys("acme")] == ["first", "second"]
    assert await tenants.list_keys("globex") == []
    # A tenant cannot revoke (or learn of) another tenant's key.
    with pytest.raises(ApiKeyNotFound):
        await tenants.revoke_key("globex", first.record.prefix)
    assert await tenants.authenticate(first.key) is not None
    await tenants.revoke_key("acme", first.record.prefix)
    assert await tenants.authenticate(first.key) is None
    assert await tenants.authenticate(second.key) is not None  # the other key still works


async def test_an_idempotency_key_is_per_tenant_and_bound_to_the_whole_request(
    redis: Redis,
) -> None:
    keys = IdempotencyKeys(redis, ttl_s=60, prefix=f"test-{new_id()}")
    create_a = request_fingerprint("POST /v1/tasks", {"task": "a", "max_iterations": None})
    create_a3 = request_fingerprint("POST /v1/tasks", {"task": "a", "max_iterations": 3})
    assert create_a != create_a3
    assert await keys.claim("acme", "k", create_a, "task-1") == "task-1"
    assert await keys.claim("acme", "k", create_a, "task-2") == "task-1"  # the same request
    with pytest.raises(IdempotencyConflict):
        await keys.claim("acme", "k", create_a3, "task-3")
    # Another tenant's identical key and request are its own.
    assert await keys.claim("globex", "k", create_a, "task-4") == "task-4"
    await keys.release("acme", "k")
    assert await keys.claim("acme", "k", create_a3, "task-5") == "task-5"
