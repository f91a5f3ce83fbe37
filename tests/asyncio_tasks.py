"""What every asyncio task of the tests' event loop awaits, and ending the ones a test left.

The tests share one event loop (pytest-asyncio's session scope). A test that pytest-timeout
stops leaves its services' tasks on it, and pytest-timeout's dump shows threads only: an idle
loop says nothing of what a test awaited. `stacks()` follows each task's chain of awaits to the
innermost call; `end_leftovers` cancels what a session left, again and again (a task that
swallowed one cancellation gets the next at its next await), within a deadline, and lets the
loop forget those that outlive it (they swallow every cancellation), so that closing the loop
cannot hang the end of the run.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

__all__ = ["end_leftovers", "print_stacks", "stacks"]


def _chain(task: asyncio.Task[Any]) -> str:
    links: list[str] = []
    awaited: Any = task.get_coro()
    while awaited is not None and len(links) < 40:
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:  # a future, or a coroutine that has finished
            links.append(repr(awaited)[:200])
            break
        code = frame.f_code
        links.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " -> ".join(links) or "no frames"


def stacks(loop: asyncio.AbstractEventLoop | None = None) -> str:
    """One line per task of `loop` (the running one): its name and what it awaits, outermost
    call first."""
    tasks = asyncio.all_tasks(loop)
    return "\n".join(f"{t.get_name()}: {_chain(t)}" for t in sorted(tasks, key=id))


def print_stacks(title: str, loop: asyncio.AbstractEventLoop) -> None:
    print(f"~~~~~ {title}: every asyncio task ~~~~~\n{stacks(loop)}", file=sys.stderr, flush=True)


async def end_leftovers(deadline_s: float) -> list[str]:
    """Cancel every other task of the running loop until none is left or `deadline_s` passed;
    the chains of those still running then, which the loop forgets: its close would wait for
    them for ever."""
    me = asyncio.current_task()
    end = time.monotonic() + deadline_s
    while True:
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not left or time.monotonic() > end:
            chains = [f"{t.get_name()}: {_chain(t)}" for t in left]
            for task in left:
                asyncio.tasks._unregister_task(task)  # type: ignore[attr-defined]
            return chains
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=0.1)
