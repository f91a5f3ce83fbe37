"""The executor's `scan`, `pack` and `commit` (deploy/sandbox/executor/snapshot.py) on a real
directory: what changed since the last commit, nothing lost when a scan is not committed, the
bytes of a file in pieces, and nothing read through a link put in a file's place."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest

EXECUTOR = Path(__file__).resolve().parents[3] / "deploy" / "sandbox" / "executor"


def _snapshot_module() -> Any:
    if "sandbox_executor" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "sandbox_executor", EXECUTOR / "__init__.py", submodule_search_locations=[str(EXECUTOR)]
        )
        assert spec is not None and spec.loader is not None
        package = importlib.util.module_from_spec(spec)
        sys.modules["sandbox_executor"] = package
        spec.loader.exec_module(package)
    return importlib.import_module("sandbox_executor.snapshot")


@pytest.fixture
def snapshots(tmp_path: Path) -> Any:
    return _snapshot_module().Snapshots(str(tmp_path))


def _scan(snapshots: Any, **fields: Any) -> dict[str, Any]:
    reply = snapshots.scan(fields)
    changed = list(reply["changed"])
    while reply["more"] and len(changed) < reply["total"]:
        page = snapshots.scan({"scan": reply["scan"], "start": len(changed)})
        changed += page["changed"]
    return {**reply, "changed": changed}


def _paths(reply: dict[str, Any]) -> set[str]:
    return {entry["p"] for entry in reply["changed"]}


def test_only_what_changed_since_the_last_commit_is_reported(
    snapshots: Any, tmp_path: Path
) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("a = 1\n")
    (tmp_path / "src" / "b.py").write_text("b = 2\n")
    (tmp_path / ".hidden").write_text("kept too\n")
    os.symlink("src/a.py", tmp_path / "link")
    (tmp_path / ".deckhands").mkdir()  # the runtime's own folder
    (tmp_path / ".deckhands" / "baseline").write_text("not the agent's\n")

    first = _scan(snapshots)
    assert _paths(first) == {"src", "src/a.py", "src/b.py", ".hidden", "link"}
    by_path = {e["p"]: e for e in first["changed"]}
    assert by_path["src/a.py"]["h"] == hashlib.sha256(b"a = 1\n").hexdigest()
    assert by_path["link"] == {**by_path["link"], "t": "l", "h": "src/a.py"}
    assert by_path["src"]["t"] == "d" and first["files"] == 5
    snapshots.commit({"scan": first["scan"]})

    (tmp_path / "src" / "a.py").write_text("a = 10\n")
    (tmp_path / "src" / "b.py").unlink()
    os.chmod(tmp_path / ".hidden", 0o600)
    second = _scan(snapshots)
    # The folder's times changed with the removal: reported too, as it is now.
    assert _paths(second) - {"src"} == {"src/a.py", ".hidden"}
    assert second["deleted"] == ["src/b.py"]

    # Not committed (the runtime died before storing it): the next scan reports it all again.
    again = _scan(snapshots)
    assert _paths(again) == _paths(second) and again["deleted"] == ["src/b.py"]
    snapshots.commit({"scan": again["scan"]})
    assert _paths(_scan(snapshots)) == set()

    # `full`: every path, as the runtime that lost its copy of the base asks.
    assert _paths(_scan(snapshots, full=True)) == {"src", "src/a.py", ".hidden", "link"}


def test_a_large_change_comes_in_pages(snapshots: Any, tmp_path: Path) -> None:
    module = _snapshot_module()
    for i in range(module.PAGE_ENTRIES + 7):
        (tmp_path / f"f{i}").write_text(str(i))
    reply = snapshots.scan({})
    assert reply["more"] and reply["total"] == module.PAGE_ENTRIES + 7
    assert len(_scan(snapshots)["changed"]) == module.PAGE_ENTRIES + 7
    with pytest.raises(module.Fail):
        snapshots.scan({"scan": "no-such-scan"})


def test_a_workspace_over_its_bounds_is_too_large_and_keeps_nothing(
    snapshots: Any, tmp_path: Path
) -> None:
    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(b"x" * 1000)
    by_files = snapshots.scan({"max_files": 3})
    assert by_files["too_large"] and by_files["changed"] == [] and by_files["scan"] == ""
    by_bytes = snapshots.scan({"max_bytes": 2500})
    assert by_bytes["too_large"] and by_bytes["bytes"] > 2500
    assert not snapshots.scan({"max_files": 10, "max_bytes": 10_000})["too_large"]


def test_pack_sends_a_files_bytes_in_pieces_and_never_through_a_link(
    snapshots: Any, tmp_path: Path
) -> None:
    big = os.urandom(3 << 20)
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "small.txt").write_text("small\n")
    (tmp_path / "secret").write_text("outside the file asked for\n")
    got: dict[int, bytes] = {0: b"", 1: b""}
    files, start, index = ["big.bin", "small.txt"], 0, 0
    while index < len(files):
        reply = snapshots.pack({"files": files[index:], "start": start, "max_bytes": 1 << 20})
        data = base64.b64decode(reply["data"])
        assert len(data) <= 1 << 20
        offset = 0
        for piece in reply["pieces"]:
            got[index + piece["i"]] += data[offset : offset + piece["n"]]
            offset += piece["n"]
        last = reply["pieces"][-1]
        if last["end"]:
            index, start = index + last["i"] + 1, 0
        else:
            index, start = index + last["i"], len(got[index + last["i"]])
    assert got[0] == big and got[1] == b"small\n"

    # The agent put a link where a file was: pack reads nothing through it.
    (tmp_path / "small.txt").unlink()
    os.symlink(tmp_path / "secret", tmp_path / "small.txt")
    reply = snapshots.pack({"files": ["small.txt"]})
    assert [p["n"] for p in reply["pieces"]] == [0] and reply["pieces"][0]["error"]
    assert base64.b64decode(reply["data"]) == b""


def test_pack_refuses_a_path_outside_the_workspace(snapshots: Any) -> None:
    module = _snapshot_module()
    with pytest.raises(module.Fail):
        snapshots.pack({"files": ["../etc/passwd"]})


def test_pack_follows_no_link_on_the_way_to_a_file_and_never_waits_on_a_fifo(
    snapshots: Any, tmp_path: Path
) -> None:
    """The agent swaps a folder for a link (to a folder outside, or to /proc/self, the
    executor's own) or a file for a fifo between a scan and the read: nothing is read, the
    executor does not hang, and the rest is still sent."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "environ").write_text("the agent's own file\n")
    (tmp_path / "pkg" / "pipe").write_text("a file, for now\n")
    (tmp_path / "ok.txt").write_text("fine\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "environ").write_text("not the workspace's\n")
    snapshots.commit({"scan": snapshots.scan({})["scan"]})

    (tmp_path / "pkg" / "pipe").unlink()
    os.mkfifo(tmp_path / "pkg" / "pipe")
    reply = snapshots.pack({"files": ["pkg/pipe", "ok.txt"]})
    assert reply["pieces"][0]["error"] and base64.b64decode(reply["data"]) == b"fine\n"

    for target in (outside, Path("/proc/self")):
        (tmp_path / "pkg").rename(tmp_path / f"was-{target.name}")
        os.symlink(target, tmp_path / "pkg")
        reply = snapshots.pack({"files": ["pkg/environ", "ok.txt"]})
        assert reply["pieces"][0]["error"], target
        assert base64.b64decode(reply["data"]) == b"fine\n", target
        (tmp_path / "pkg").unlink()
        (tmp_path / f"was-{target.name}").rename(tmp_path / "pkg")

    # A scan hashes no fifo either (it would wait for a writer): it is skipped.
    (tmp_path / "pkg" / "pipe").unlink()
    os.mkfifo(tmp_path / "late-fifo")
    reply = snapshots.scan({})
    assert "late-fifo" not in {e["p"] for e in reply["changed"]} and reply["skipped"] >= 1
