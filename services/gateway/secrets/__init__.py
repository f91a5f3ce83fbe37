"""Tenants' secrets behind the API (the store itself: shared/secrets_store.py), and the refill of
Redis from their durable copy."""
