"""A request's API key and its tenant, read from Redis in one round trip.

Every authenticated request reads both: the credential cached for the key's hash, and the
tenant it names. One read-only script (EVALSHA_RO) answers both, and runs where the two GETs it
replaces ran: while Redis holds writes (a failover's CLIENT PAUSE WRITE) and on a replica.
Either answer is None when Redis does not have it; the bucket has the last word then
(TenantStore.authenticate).
"""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

__all__ = ["credential_and_tenant"]

_SCRIPT = """
local credential = redis.call('GET', KEYS[1])
if not credential then return {false, false} end
local ok, decoded = pcall(cjson.decode, credential)
if not ok or type(decoded) ~= 'table' or type(decoded['tenant_id']) ~= 'string' then
  return {credential, false}
end
return {credential, redis.call('GET', ARGV[1] .. decoded['tenant_id'])}
"""
_SHA = hashlib.sha1(_SCRIPT.encode()).hexdigest()


async def credential_and_tenant(
    redis: Redis, credential_key: str, tenant_key_prefix: str
) -> tuple[bytes | None, bytes | None]:
    """(the credential at `credential_key`, the tenant at `tenant_key_prefix` + its tenant id)."""
    try:
        answer = await redis.evalsha_ro(_SHA, 1, credential_key, tenant_key_prefix)
    except NoScriptError:  # a Redis started since (or flushed): EVAL_RO caches it again
        answer = await redis.eval_ro(_SCRIPT, 1, credential_key, tenant_key_prefix)
    credential, tenant = answer
    return credential, tenant
