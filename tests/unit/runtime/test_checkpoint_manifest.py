"""Checkpoint manifests (services/runtime/checkpoint_manifest.py): a checkpoint stored as what
changed since the one before, read back whole through its chain, and stored whole every
FULL_EVERY checkpoints; and what a restore writes."""

from __future__ import annotations

from services.runtime.checkpoint_manifest import FULL_EVERY, Delta, Entry, Manifest
from services.runtime.checkpoint_restore import _writable

_EMPTY = Manifest(seq=0, depth=FULL_EVERY - 1, entries={})


def _file(sha: str, size: int = 1) -> Entry:
    return ("f", 0o644, size, sha)


def test_a_checkpoint_stores_only_what_changed_and_reads_back_whole() -> None:
    first = _EMPTY.delta_to(3, {"a": _file("1"), "b": _file("2"), "d": ("d", 0o755, 0, "")}, set())
    assert first.base_seq is None and set(first.changed) == {"a", "b", "d"}
    whole = Manifest.whole(Delta.decode(first.encode()))

    second = whole.delta_to(7, {"a": _file("1"), "c": _file("3")}, {"b"})
    assert second.base_seq == 3 and second.depth == 1
    assert second.changed == {"c": _file("3")}  # "a" is as it was: not stored again
    assert second.deleted == ("b",)
    decoded = Delta.decode(second.encode())
    assert decoded == second
    after = whole.then(decoded)
    assert after.seq == 7 and after.entries == {
        "a": _file("1"),
        "c": _file("3"),
        "d": ("d", 0o755, 0, ""),
    }
    assert after.file_bytes == 2


def test_every_so_many_checkpoints_one_is_stored_whole() -> None:
    manifest = Manifest.whole(_EMPTY.delta_to(1, {"a": _file("0")}, set()))
    depths = []
    for seq in range(2, 2 + FULL_EVERY):
        delta = manifest.delta_to(seq, {"a": _file(str(seq))}, set())
        depths.append(delta.depth)
        manifest = Manifest.whole(delta) if delta.base_seq is None else manifest.then(delta)
    assert depths[: FULL_EVERY - 1] == list(range(1, FULL_EVERY))
    assert depths[FULL_EVERY - 1] == 0  # whole again: no chain longer than FULL_EVERY
    assert manifest.entries == {"a": _file(str(1 + FULL_EVERY))}


def test_a_restore_writes_nothing_outside_the_workspace_or_through_a_link() -> None:
    entries = {
        "src": ("d", 0o755, 0, ""),
        "src/a.py": _file("1"),
        "out": ("l", 0o777, 4, "/etc"),
        "out/passwd": _file("2"),
        "../escape": _file("3"),
        "/abs": _file("4"),
        "src/./b": _file("5"),
        "src//c": _file("6"),
        "src-b": _file("7"),
    }
    assert [p for p, _ in _writable(entries)] == ["out", "src", "src-b", "src/a.py"]
