"""The event sequencer (each seq once, none skipped) and SSE framing: pure logic."""

from __future__ import annotations

import json

from services.gateway.events.stream import EventSequencer, is_terminal_event
from services.gateway.http.sse import sse_comment, sse_event, sse_retry


def ev(seq: int | None, kind: str = "message", **fields: object) -> dict[str, object]:
    return {"seq": seq, "kind": kind, **fields}


def test_sequencer_emits_in_order_each_seq_once() -> None:
    seq = EventSequencer(after=0)
    for s in (2, 1, 2, 1, 3):
        seq.offer(ev(s))
    assert [e["seq"] for e in seq.ready()] == [1, 2, 3]
    seq.offer(ev(3))
    seq.offer(ev(1))
    assert seq.ready() == []
    assert seq.last == 3


def test_sequencer_holds_events_after_a_gap_until_it_is_filled() -> None:
    seq = EventSequencer(after=4)
    seq.offer(ev(4))  # already delivered before the resume point
    seq.offer(ev(7))
    seq.offer(ev(6))
    assert seq.ready() == []
    assert not seq.has_next() and seq.highest_known == 7
    seq.offer(ev(5))
    assert seq.has_next()
    assert [e["seq"] for e in seq.ready()] == [5, 6, 7]
    assert seq.highest_known == 7 == seq.last


def test_sequencer_keeps_the_first_copy_and_ignores_events_without_seq() -> None:
    seq = EventSequencer(after=0)
    seq.offer(ev(1, content="first"))
    seq.offer(ev(1, content="second"))
    seq.offer(ev(None))
    seq.offer({"kind": "message"})
    seq.offer(ev(True))  # type: ignore[arg-type]  # a bool is not a seq
    assert seq.ready() == [ev(1, content="first")]


def test_terminal_events() -> None:
    assert is_terminal_event(ev(1, "agent_state_changed", agent_state="FINISHED"))
    assert is_terminal_event(ev(1, "agent_state_changed", agent_state="ERROR"))
    assert not is_terminal_event(ev(1, "agent_state_changed", agent_state="PAUSED"))
    assert not is_terminal_event(ev(1, "finish"))


def test_sse_event_is_one_frame_with_one_data_line() -> None:
    event = ev(12, "run_output", content="line one\nline two\r\n\n", note="ü")
    frame = sse_event(12, "run_output", event)
    assert frame.endswith("\n\n") and frame.count("\n\n") == 1
    lines = frame.rstrip("\n").split("\n")
    assert lines[:2] == ["id: 12", "event: run_output"]
    assert len(lines) == 3 and lines[2].startswith("data: ")
    assert json.loads(lines[2].removeprefix("data: ")) == event


def test_sse_event_name_cannot_break_the_frame() -> None:
    assert sse_event(1, "bad\nname", {}).split("\n")[1] == "event: badname"
    assert sse_event(1, "", {}).split("\n")[1] == "event: message"


def test_sse_comment_and_retry() -> None:
    assert sse_comment("keep-alive") == ": keep-alive\n\n"
    assert sse_comment("a\nb") == ": a b\n\n"
    assert sse_retry(2000) == "retry: 2000\n\n"
