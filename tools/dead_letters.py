"""List, show, replay and drop dead letters (the messages a service gave up on).

    python -m tools.dead_letters list [--service runtime] [--task ID] [--limit 50]
    python -m tools.dead_letters show SEQ
    python -m tools.dead_letters replay SEQ [SEQ...]   (or --all, with the same filters as list)
    python -m tools.dead_letters drop SEQ [SEQ...]

A dead letter keeps the original bytes and, in headers, where it came from and why
(shared/delivery.py). Replaying publishes it again to its original subject and stream, under a
new message id, then removes it from the dead-letter stream: fix the cause first. A work order
whose task has since ended in ERROR is then ignored as stale by the controller; resume the task
instead. A copy cut to 256 KiB (`Deckhands-Dlq-Truncated-From`) cannot be replayed.
The NATS server is DECKHANDS_NATS_URL (or --nats).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import nats
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from shared.events import new_id
from shared.settings import CommonSettings
from shared.subjects import DLQ_STREAM, dlq_subject

__all__ = ["DeadLetter", "drop", "list_dead_letters", "main", "replay"]


class ReplayRefused(Exception):
    """This dead letter cannot be published again as it is."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    time: datetime | None
    service: str
    subject: str
    stream: str
    task_id: str | None
    reason: str
    deliveries: str
    size: int
    truncated_from: int | None
    data: bytes

    @classmethod
    def from_raw(cls, msg: RawStreamMsg) -> DeadLetter:
        headers = msg.headers or {}
        subject = headers.get("Deckhands-Dlq-Subject", "")
        parts = subject.split(".")
        task_id = parts[3] if len(parts) == 4 and subject.startswith("deckhands.work.") else None
        if subject.startswith("deckhands.events."):
            task_id = parts[2] if len(parts) == 3 else None
        truncated = headers.get("Deckhands-Dlq-Truncated-From")
        return cls(
            seq=int(msg.seq or 0),
            time=msg.time,
            service=headers.get("Deckhands-Dlq-Service", (msg.subject or "").split(".")[-1]),
            subject=subject,
            stream=headers.get("Deckhands-Dlq-Stream", ""),
            task_id=task_id,
            reason=headers.get("Deckhands-Dlq-Reason", ""),
            deliveries=headers.get("Deckhands-Dlq-Deliveries", "?"),
            size=len(msg.data or b""),
            truncated_from=int(truncated) if truncated else None,
            data=msg.data or b"",
        )


async def list_dead_letters(
    js: JetStreamContext,
    *,
    service: str | None = None,
    task_id: str | None = None,
    limit: int | None = None,
) -> list[DeadLetter]:
    """Dead letters in stream order, oldest first."""
    subject = dlq_subject(service) if service else "deckhands.dlq.>"
    found: list[DeadLetter] = []
    seq = 1
    while limit is None or len(found) < limit:
        try:
            raw = await js.get_msg(DLQ_STREAM, seq, subject=subject, next=True)
        except NotFoundError:
            break
        letter = DeadLetter.from_raw(raw)
        seq = letter.seq + 1
        if task_id is None or letter.task_id == task_id:
            found.append(letter)
    return found


async def _one(js: JetStreamContext, seq: int) -> DeadLetter:
    try:
        return DeadLetter.from_raw(await js.get_msg(DLQ_STREAM, seq))
    except NotFoundError:
        raise ReplayRefused(f"no dead letter with seq {seq}") from None


async def replay(js: JetStreamContext, seq: int) -> DeadLetter:
    """Publish the dead letter again where it came from, then remove it from the DLQ."""
    letter = await _one(js, seq)
    if letter.truncated_from is not None:
        raise ReplayRefused(
            f"dead letter {seq} keeps only {letter.size} of its {letter.truncated_from} bytes"
        )
    if not letter.subject or not letter.stream:
        raise ReplayRefused(f"dead letter {seq} does not say where it came from")
    await js.publish(
        letter.subject,
        letter.data,
        stream=letter.stream,
        headers={"Nats-Msg-Id": f"replay-{seq}-{new_id()}", "content-type": "application/json"},
    )
    await js.delete_msg(DLQ_STREAM, seq)
    return letter


async def drop(js: JetStreamContext, seq: int) -> None:
    await _one(js, seq)
    await js.delete_msg(DLQ_STREAM, seq)


def _line(letter: DeadLetter) -> str:
    when = letter.time.strftime("%Y-%m-%d %H:%M:%S") if letter.time else "?"
    cut = f" (cut from {letter.truncated_from} B)" if letter.truncated_from else ""
    return (
        f"{letter.seq:>6}  {when}  {letter.service:<10} task {letter.task_id or '-':<32}  "
        f"{letter.size} B{cut}, {letter.deliveries} deliveries: {letter.reason[:160]}"
    )


async def _run(args: argparse.Namespace) -> int:
    servers = [url.strip() for url in args.nats.split(",") if url.strip()]
    nc = await nats.connect(servers=servers, connect_timeout=5, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        if args.command == "list":
            letters = await list_dead_letters(
                js, service=args.service, task_id=args.task, limit=args.limit
            )
            for letter in letters:
                print(_line(letter))
            print(f"{len(letters)} dead letter(s)")
            return 0
        if args.command == "show":
            letter = await _one(js, args.seq[0])
            print(_line(letter))
            print(f"subject {letter.subject} (stream {letter.stream})")
            print(letter.data.decode(errors="replace"))
            return 0
        seqs = list(args.seq)
        if args.command == "replay" and args.all:
            letters = await list_dead_letters(js, service=args.service, task_id=args.task)
            seqs = [letter.seq for letter in letters]
        failed = 0
        for seq in seqs:
            try:
                if args.command == "replay":
                    letter = await replay(js, seq)
                    print(f"replayed {seq} to {letter.subject}")
                else:
                    await drop(js, seq)
                    print(f"dropped {seq}")
            except ReplayRefused as exc:
                print(f"not {args.command}ed: {exc}", file=sys.stderr)
                failed += 1
        return 1 if failed else 0
    finally:
        await nc.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.dead_letters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nats", default=CommonSettings().nats_url, help="NATS server URL(s), comma-separated"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="dead letters, oldest first")
    listing.add_argument("--service")
    listing.add_argument("--task")
    listing.add_argument("--limit", type=int, default=100)
    show = sub.add_parser("show", help="one dead letter with its body")
    show.add_argument("seq", type=int, nargs=1)
    again = sub.add_parser("replay", help="publish again to the original subject, then remove")
    again.add_argument("seq", type=int, nargs="*")
    again.add_argument("--all", action="store_true", help="every one matching the filters")
    again.add_argument("--service")
    again.add_argument("--task")
    gone = sub.add_parser("drop", help="remove without replaying")
    gone.add_argument("seq", type=int, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "replay" and not args.seq and not args.all:
        parser.error("replay needs SEQ... or --all")
    return asyncio.run(_run(args))


if __name__ == "__main__":
    raise SystemExit(main())
