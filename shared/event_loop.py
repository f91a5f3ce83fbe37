"""How every service runs its asyncio program: on uvloop.

A step of an agent is a handful of small messages through each service, so most of a service's
CPU is the event loop's own bookkeeping (callbacks, timers, socket reads and writes): about a
quarter of each service's profile on the standard loop. uvloop (libuv, already what uvicorn
runs the gateway on) does the same work in C."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

import uvloop

__all__ = ["run"]

T = TypeVar("T")


def run(program: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a uvloop event loop."""
    return uvloop.run(program)
