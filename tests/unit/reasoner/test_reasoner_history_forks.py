"""Forks made together hold one copy of their parent's history in the reasoner's cache (issue
28, item 2): each fork's inherited entries are the objects another fork of the same parent
read first; the fork's own entries stay its own."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from services.reasoner.history import HistoryCache
from services.reasoner.prompt import build_messages
from shared.commands import HistoryReply, HistoryRequest
from shared.events import CmdOutputObservation, CmdRunAction, EventSource, MessageAction

PARENT = "t-parent"


def _fork_log(fork: str) -> list[dict[str, Any]]:
    """A fork's log as storage holds it: the parent's entries 2..4 copied under ids of the
    fork's own, then the fork's message (its creation entry, seq 1, left out here)."""
    run = CmdRunAction(
        id=f"{fork}-run",
        task_id=fork,
        source=EventSource.AGENT,
        command="ls",
        seq=3,
        inherited_from=PARENT,
        tool_call_id="call-1",
    )
    entries = [
        MessageAction(task_id=fork, source=EventSource.SYSTEM, content="", seq=1),
        MessageAction(
            task_id=fork, source=EventSource.USER, content="do it", seq=2, inherited_from=PARENT
        ),
        run,
        CmdOutputObservation(
            task_id=fork,
            source=EventSource.ENVIRONMENT,
            cause=run.id,
            command="ls",
            content="a.txt",
            exit_code=0,
            cwd="/workspace",
            seq=4,
            inherited_from=PARENT,
        ),
        MessageAction(task_id=fork, source=EventSource.USER, content=f"try {fork}", seq=5),
    ]
    return [e.model_dump(mode="json") for e in entries]


class _Storage:
    """Storage's history replies (the reasoner asks over NATS request/reply)."""

    async def request(self, body: HistoryRequest, subject: str, timeout: float) -> Any:
        events = [e for e in _fork_log(body.task_id) if e["seq"] > body.after]
        reply = HistoryReply(task_id=body.task_id, events=events, last_seq=5)
        return SimpleNamespace(body=reply.model_dump_json().encode())


async def test_forks_of_one_parent_share_their_inherited_entries() -> None:
    cache = HistoryCache(
        _Storage(),  # type: ignore[arg-type]
        max_bytes=1 << 20,
        page_size=100,
        page_bytes=1 << 20,
        request_timeout_s=1,
        wait_s=1,
    )
    one = await cache.fetch("fork-1", 5)
    two = await cache.fetch("fork-2", 5)
    assert [e.seq for e in one] == [e.seq for e in two] == [1, 2, 3, 4, 5]
    assert all(a is b for a, b in zip(one[1:4], two[1:4], strict=True))
    assert one[0] is not two[0] and one[4] is not two[4]
    assert two[4].content == "try fork-2"
    # The prompt of each reads the same history, and its own message.
    prompt = build_messages(two, native=True)
    assert prompt[-1] == {"role": "user", "content": "try fork-2"}
    assert any("a.txt" in str(m.get("content")) for m in prompt), prompt
