"""API keys: their format and hash (pure), and their lookup, listing and revocation in
TenantStore on a real redis-server and a real NATS key-value bucket (the durable copy);
disabled and deleted tenants, a tenant's own keys, a Redis that lost its data; idempotency
bindings per tenant."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from redis.asyncio import Redis

from services.gateway.errors import (
    ApiKeyNotFound,
    IdempotencyConflict,
    TenantExists,
    TenantNotFound,
)
from services.gateway.quotas.limits import QuotaDefaults, TenantLimits
from services.gateway.quotas.service import TenantQuotas
from services.gateway.tasks.idempotency import IdempotencyKeys, request_fingerprint
from services.gateway.tenants.api_keys import (
    hash_api_key,
    issue_api_key,
    key_prefix_of,
    same_secret,
)
from services.gateway.tenants.records import TenantRecords
from services.gateway.tenants.store import LastKey, TenantDisabled, TenantStore
from shared.events import new_id
from shared.state_store import TaskStateStore


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
def records(kv_records: TenantRecords) -> TenantRecords:
    return kv_records


@pytest.fixture
def tenants(redis: Redis, records: TenantRecords) -> TenantStore:
    # A prefix of the test's own: the tests share one redis-server.
    return TenantStore(redis, records, prefix=f"test-{new_id()}")


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
    # The durable copy neither.
    for name, value in await tenants.records.values(">"):
        stored += name.encode() + value
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


async def test_a_disabled_tenants_keys_are_refused_naming_why_until_enabled(
    tenants: TenantStore,
) -> None:
    await tenants.create_tenant("acme", "ACME")
    issued = await tenants.issue_key("acme", "ci")
    assert await tenants.authenticate(issued.key) is not None
    disabled = await tenants.disable("acme", "invoice 42 unpaid")
    assert disabled.disabled_at is not None
    with pytest.raises(TenantDisabled) as refused:
        await tenants.authenticate(issued.key)
    assert refused.value.status_code == 403
    assert "tenant 'acme' is disabled" in refused.value.detail
    assert "invoice 42 unpaid" in refused.value.detail
    assert [t.disabled_reason for t in await tenants.list_tenants()] == ["invoice 42 unpaid"]
    await tenants.enable("acme")
    assert await tenants.authenticate(issued.key) is not None


async def test_a_deleted_tenant_loses_its_keys_and_its_id_is_not_given_again(
    tenants: TenantStore,
) -> None:
    await tenants.create_tenant("acme", "ACME")
    await tenants.create_tenant("globex", "Globex")
    first, second = await tenants.issue_key("acme", "a"), await tenants.issue_key("acme", "b")
    other = await tenants.issue_key("globex", "")
    assert await tenants.delete_tenant("acme") == 2
    assert await tenants.authenticate(first.key) is None
    assert await tenants.authenticate(second.key) is None
    assert await tenants.authenticate(other.key) is not None
    with pytest.raises(TenantNotFound):
        await tenants.get_tenant("acme")
    assert [t.id for t in await tenants.list_tenants()] == ["globex"]
    # Its tasks' records name it: a new tenant of that id would inherit them.
    with pytest.raises(TenantExists, match="was deleted"):
        await tenants.create_tenant("acme", "ACME again")


async def test_a_tenant_makes_and_revokes_its_own_keys_but_not_its_last_by_accident(
    tenants: TenantStore,
) -> None:
    await tenants.create_tenant("acme", "ACME")
    first = await tenants.issue_key("acme", "admin-made")
    caller = await tenants.authenticate(first.key)
    assert caller is not None
    second = await tenants.issue_key("acme", "ci", created_by=caller.key_prefix)
    assert second.record.created_by == first.record.prefix
    assert await tenants.authenticate(second.key) is not None
    listed = await tenants.list_keys("acme")
    assert [k.prefix for k in listed] == [first.record.prefix, second.record.prefix]
    used = await tenants.last_used([k.prefix for k in listed])
    assert set(used) == {first.record.prefix, second.record.prefix}  # both authenticated

    await tenants.revoke_key("acme", first.record.prefix, keep_one=True)
    with pytest.raises(LastKey) as refused:
        await tenants.revoke_key("acme", second.record.prefix, keep_one=True)
    assert refused.value.status_code == 409 and "last working key" in refused.value.detail
    assert await tenants.authenticate(second.key) is not None
    await tenants.revoke_key("acme", second.record.prefix, keep_one=False)  # forced
    assert await tenants.authenticate(second.key) is None


async def test_keys_tenants_and_limits_outlive_redis(
    tenants: TenantStore, records: TenantRecords, redis: Redis
) -> None:
    """Redis loses everything (FLUSHALL): the bucket is the source of truth, so a key still
    authenticates, a disabled tenant stays disabled, a revoked key stays revoked, and the
    tenant's limits still apply."""
    quotas = TenantQuotas(TaskStateStore(redis), QuotaDefaults(), "keys-tests")
    quotas.records = records
    await tenants.create_tenant("acme", "ACME")
    await tenants.create_tenant("globex", "Globex")
    kept, revoked = await tenants.issue_key("acme", "kept"), await tenants.issue_key("acme", "x")
    disabled = await tenants.issue_key("globex", "")
    await tenants.revoke_key("acme", revoked.record.prefix)
    await tenants.disable("globex", "audit")
    await quotas.set_limits("acme", TenantLimits(max_running_tasks=3, max_sandboxes=2))
    assert await tenants.authenticate(revoked.key) is None  # cached as unknown now

    await redis.flushall()

    caller = await tenants.authenticate(kept.key)
    assert caller is not None and caller.tenant_id == "acme"
    assert await tenants.authenticate(revoked.key) is None
    with pytest.raises(TenantDisabled):
        await tenants.authenticate(disabled.key)
    limits = await quotas.quotas("acme")
    assert (limits.max_running_tasks, limits.max_sandboxes) == (3, 2)
    assert (await quotas.quotas("globex")).max_running_tasks == QuotaDefaults().max_running_tasks
    # Refilled: the next lookups are Redis's again.
    assert await redis.exists(f"{tenants.prefix}:apikey-hash:{kept.record.key_hash}")
    assert await redis.exists("deckhands:tenant:acme:limits")


async def test_a_key_authenticates_while_redis_holds_writes_and_after_its_scripts_are_gone(
    tenants: TenantStore, redis: Redis
) -> None:
    """The key and its tenant are read in one read-only script: it runs while Redis holds
    every write (a failover's CLIENT PAUSE WRITE), and is cached again after Redis forgot its
    scripts (a restart); the tenant disabled or missing from Redis is seen as before."""
    await tenants.create_tenant("acme", "ACME")
    issued = await tenants.issue_key("acme", "")
    assert await tenants.authenticate(issued.key) is not None  # cached in Redis now
    await redis.script_flush()
    await redis.execute_command("CLIENT", "PAUSE", 3000, "WRITE")
    try:
        caller = await asyncio.wait_for(tenants.authenticate(issued.key), 2.0)
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    assert caller is not None and caller.tenant_id == "acme"
    # The tenant's cached copy gone: read from the bucket again.
    await redis.delete(tenants._tenant("acme"))
    caller = await tenants.authenticate(issued.key)
    assert caller is not None and caller.tenant_id == "acme"
    await tenants.disable("acme", "audit")
    with pytest.raises(TenantDisabled):
        await tenants.authenticate(issued.key)
