"""What a checkpoint holds: every path of /workspace with its type, mode, size and content.

A checkpoint is stored as an addition to the one before it (`Delta`: the paths new or changed
since, and those removed), so a one-file edit stores one entry, not the whole tree; every
`FULL_EVERY`-th checkpoint of a task is stored whole, so reading one back never walks a long
chain. `Manifest` is a checkpoint's whole tree, a chain of additions applied.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field

__all__ = ["FULL_EVERY", "Delta", "Entry", "Manifest"]

FULL_EVERY = 32
_VERSION = 1

# (type "f" | "d" | "l", permission bits, size, SHA-256 of a file or a link's target or "")
Entry = tuple[str, int, int, str]


@dataclass(frozen=True)
class Delta:
    """A checkpoint as stored: what changed since `base_seq` (None: every path)."""

    seq: int
    base_seq: int | None
    depth: int  # additions since the last whole one
    changed: dict[str, Entry] = field(default_factory=dict)
    deleted: tuple[str, ...] = ()
    cwd: str = ""  # the shell's directory after the action ("": not known)

    def encode(self) -> bytes:
        body = {
            "v": _VERSION,
            "seq": self.seq,
            "base": self.base_seq,
            "depth": self.depth,
            "changed": {p: list(e) for p, e in self.changed.items()},
            "deleted": list(self.deleted),
            "cwd": self.cwd,
        }
        return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)

    @classmethod
    def decode(cls, data: bytes) -> Delta:
        body = json.loads(zlib.decompress(data))
        if body.get("v") != _VERSION:
            raise ValueError(f"a checkpoint manifest of version {body.get('v')!r}")
        return cls(
            seq=int(body["seq"]),
            base_seq=None if body["base"] is None else int(body["base"]),
            depth=int(body["depth"]),
            changed={
                p: (str(t), int(m), int(s), str(h)) for p, (t, m, s, h) in body["changed"].items()
            },
            deleted=tuple(str(p) for p in body["deleted"]),
            cwd=str(body.get("cwd") or ""),
        )


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's whole tree."""

    seq: int
    depth: int
    entries: dict[str, Entry]
    cwd: str = ""

    @classmethod
    def whole(cls, delta: Delta) -> Manifest:
        return cls(seq=delta.seq, depth=0, entries=dict(delta.changed), cwd=delta.cwd)

    def then(self, delta: Delta) -> Manifest:
        entries = dict(self.entries)
        for path in delta.deleted:
            entries.pop(path, None)
        entries.update(delta.changed)
        return Manifest(seq=delta.seq, depth=delta.depth, entries=entries, cwd=delta.cwd)

    @property
    def file_bytes(self) -> int:
        return sum(e[2] for e in self.entries.values() if e[0] == "f")

    def delta_to(self, seq: int, now: dict[str, Entry], removed: set[str], cwd: str = "") -> Delta:
        """The checkpoint at `seq` of the tree `self` changed by `now` (paths as they are) and
        `removed`: an addition to this one, or a whole one every FULL_EVERY."""
        entries = dict(self.entries)
        for path in removed:
            entries.pop(path, None)
        entries.update(now)
        if self.depth + 1 >= FULL_EVERY:
            return Delta(seq=seq, base_seq=None, depth=0, changed=entries, cwd=cwd)
        changed = {p: e for p, e in now.items() if self.entries.get(p) != e}
        deleted = tuple(sorted(p for p in removed if p in self.entries))
        return Delta(
            seq=seq,
            base_seq=self.seq,
            depth=self.depth + 1,
            changed=changed,
            deleted=deleted,
            cwd=cwd,
        )
