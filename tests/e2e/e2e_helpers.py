"""Helpers shared by the e2e tests that kill parts of a running stack."""

from __future__ import annotations

import time
from typing import Any

import httpx

__all__ = ["get_until_ok"]


def get_until_ok(client: httpx.Client, path: str) -> Any:
    """GET `path` until it answers 200 (the gateway, NATS or Redis may be the one killed just
    now), for about 30 s; the error names the last answer."""
    last = "no answer"
    for _ in range(150):
        try:
            response = client.get(path)
            if response.status_code == 200:
                return response.json()
            last = f"{response.status_code} {response.text[:300]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"GET {path} kept failing; last: {last}")
