"""Tenants and their API keys: the durable records, their Redis cache, the audit log, and what the
operator does to a tenant as a whole."""
