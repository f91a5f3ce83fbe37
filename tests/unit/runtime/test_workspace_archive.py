"""Uploads into a workspace are rewritten entry by entry (services/runtime/workspace_archive.py):
what may go in, what is refused, and what a download leaves out."""

from __future__ import annotations

import io
import stat
import tarfile
import zipfile

import pytest

from services.runtime.errors import ArchiveRefused, ArchiveTooLarge
from services.runtime.workspace_archive import (
    check_path,
    clean_upload,
    gzip_tree,
    single_file_tar,
)

pytestmark = pytest.mark.timeout(30)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None], mode: str = "w") -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def _file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, None


def _clean(source: io.BytesIO, archive: str = "tar", **limits: int) -> list[tarfile.TarInfo]:
    out = io.BytesIO()
    clean_upload(
        source,
        archive,
        out,
        max_bytes=limits.get("max_bytes", 1 << 20),
        max_files=limits.get("max_files", 100),
        base=None,
    )
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        return tar.getmembers()


@pytest.mark.parametrize(
    ("path", "clean"),
    [("a/b.txt", "a/b.txt"), ("/workspace/a/./b.txt", "a/b.txt"), ("a//b", "a/b")],
)
def test_paths_inside_the_workspace_are_normalised(path: str, clean: str) -> None:
    assert check_path(path) == clean


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "", "/workspace", "a\nb"])
def test_paths_that_leave_the_workspace_are_refused(path: str) -> None:
    with pytest.raises(ArchiveRefused):
        check_path(path)


def test_a_clean_tar_is_sandbox_owned_without_setuid_and_parents_come_first() -> None:
    members = _clean(_tar(_file("deep/dir/run.sh", b"#!/bin/sh\n", 0o4755)))
    assert [(m.name, m.isdir()) for m in members] == [
        ("deep", True),
        ("deep/dir", True),
        ("deep/dir/run.sh", False),
    ]
    script = members[-1]
    assert (script.uid, script.gid, script.uname) == (1000, 1000, "sandbox")
    assert script.mode == 0o755 and not script.mode & stat.S_ISUID


def test_the_archive_s_own_root_entry_is_skipped() -> None:
    # `tar -C dir .` writes `./` first, then `./a.txt`.
    root = tarfile.TarInfo("./")
    root.type, root.mode = tarfile.DIRTYPE, 0o755
    members = _clean(_tar((root, None), _file("./a.txt", b"a")))
    assert [m.name for m in members] == ["a.txt"]


def test_compressed_tars_are_read() -> None:
    members = _clean(_tar(_file("a.txt", b"x"), mode="w:gz"))
    assert [m.name for m in members] == ["a.txt"]


@pytest.mark.parametrize(
    ("member", "named"),
    [
        (_file("../evil", b"x"), ".."),
        (_file("/etc/evil", b"x"), "outside /workspace"),
        (_link("hard", "a.txt", tarfile.LNKTYPE), "hard link"),
        (_link("fifo", "", tarfile.FIFOTYPE), "special file"),
    ],
)
def test_entries_that_could_escape_are_refused(
    member: tuple[tarfile.TarInfo, bytes | None], named: str
) -> None:
    with pytest.raises(ArchiveRefused, match=named):
        _clean(_tar(_file("a.txt", b"x"), member))


def test_nothing_goes_below_a_symbolic_link_of_the_same_archive() -> None:
    with pytest.raises(ArchiveRefused, match="symbolic link"):
        _clean(_tar(_link("out", "/etc"), _file("out/passwd", b"x")))
    # A link alone is kept as a link (what it points at is the sandbox's business).
    [link] = _clean(_tar(_link("out", "/etc")))
    assert link.issym() and link.linkname == "/etc"


def test_sizes_and_counts_are_bounded_as_they_are_copied() -> None:
    with pytest.raises(ArchiveTooLarge, match="bytes"):
        _clean(_tar(_file("a", b"x" * 600), _file("b", b"x" * 600)), max_bytes=1000)
    with pytest.raises(ArchiveTooLarge, match="entries"):
        _clean(_tar(*(_file(f"f{i}", b"") for i in range(5))), max_files=4)


def test_a_zip_is_rewritten_like_a_tar() -> None:
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w") as archive:
        archive.writestr("dir/a.txt", "zipped")
        link = zipfile.ZipInfo("dir/link")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        archive.writestr(link, "a.txt")
    packed.seek(0)
    members = {m.name: m for m in _clean(packed, "zip")}
    assert members["dir"].isdir() and members["dir/a.txt"].size == 6
    assert members["dir/link"].issym() and members["dir/link"].linkname == "a.txt"
    evil = io.BytesIO()
    with zipfile.ZipFile(evil, "w") as archive:
        archive.writestr("../../evil", "x")
    evil.seek(0)
    with pytest.raises(ArchiveRefused, match=r"\.\."):
        _clean(evil, "zip")
    with pytest.raises(ArchiveRefused, match="not a zip"):
        _clean(io.BytesIO(b"no zip"), "zip")


def test_one_file_gets_its_parent_directories() -> None:
    out = io.BytesIO()
    single_file_tar("/workspace/a/b/c.txt", io.BytesIO(b"hello"), 5, out)
    out.seek(0)
    with tarfile.open(fileobj=out) as tar:
        assert [m.name for m in tar.getmembers()] == ["a", "a/b", "a/b/c.txt"]


def test_a_download_leaves_the_runtime_s_own_files_out_and_is_bounded() -> None:
    raw = _tar(
        _file("workspace/a.txt", b"keep"),
        _file("workspace/.deckhands/baseline.git/HEAD", b"ref"),
        _file("workspace/b.txt", b"x" * 10_000),
    ).getvalue()
    chunks = iter([raw[:700], raw[700:5000], raw[5000:]])
    out = io.BytesIO()
    gzip_tree(chunks, out, max_bytes=1 << 20)
    out.seek(0)
    with tarfile.open(fileobj=out, mode="r:gz") as tar:
        assert tar.getnames() == ["workspace/a.txt", "workspace/b.txt"]
    with pytest.raises(ArchiveTooLarge):
        gzip_tree(iter([raw]), io.BytesIO(), max_bytes=50)


def _damaged() -> list[tuple[str, str, bytes]]:
    noise = bytes(range(256)) * 2048
    whole = _tar(_file("a.bin", noise), _file("b.txt", b"b\n")).getvalue()
    gz = _tar(_file("a.bin", noise), mode="w:gz").getvalue()
    xz = _tar(_file("a.bin", noise), mode="w:xz").getvalue()
    bz = _tar(_file("a.bin", noise), mode="w:bz2").getvalue()
    packed = io.BytesIO()
    with zipfile.ZipFile(packed, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("a.txt", "zipped " * 1000)
    bad_crc = bytearray(packed.getvalue())
    central = bad_crc.index(b"PK\x01\x02")  # zipfile checks the central directory's CRC-32
    bad_crc[central + 16 : central + 20] = b"\0\0\0\0"
    garbled = bytearray(packed.getvalue())
    garbled[40:60] = b"\xff" * 20
    return [
        ("tar", "cut in an entry's data", whole[: 512 + 100_000]),
        ("tar", "gzip cut short", gz[: len(gz) // 2]),
        ("tar", "gzip garbled", gz[:100] + bytes(b ^ 0x5A for b in gz[100:200]) + gz[200:]),
        ("tar", "gzip data changed", gz[: len(gz) // 2] + b"\x00" * 8 + gz[len(gz) // 2 + 8 :]),
        ("tar", "xz cut short", xz[: len(xz) // 2]),
        ("tar", "data past its end", whole + b"\x01" * (2 << 20)),
        ("tar", "bz2 cut short", bz[: len(bz) // 2]),
        ("zip", "bad CRC-32", bytes(bad_crc)),
        ("zip", "garbled deflate data", bytes(garbled)),
        ("zip", "cut short", packed.getvalue()[:50]),
    ]


@pytest.mark.parametrize(("archive", "what", "data"), _damaged(), ids=lambda v: str(v)[:20])
def test_a_damaged_archive_is_refused_as_such(archive: str, what: str, data: bytes) -> None:
    # Before, a decoder's error raised while an entry's data was copied escaped as
    # tarfile.ReadError or zipfile.BadZipFile, and the runtime never answered.
    with pytest.raises(
        ArchiveRefused, match=r"damaged|cannot be read|not a|ended before|past its end"
    ):
        _clean(io.BytesIO(data), archive)


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("a" * 256, "256 bytes long"),
        ("é" * 128, "256 bytes long"),
        ("/".join(["a"] * 2100), "2100 levels deep"),
        ("/".join(["b" * 200] * 21), "bytes long, more than the limit of 4084"),
    ],
)
def test_over_long_and_over_deep_paths_are_refused(path: str, says: str) -> None:
    with pytest.raises(ArchiveRefused, match=says):
        check_path(path)
    assert check_path("a" * 255) == "a" * 255
    assert check_path("/".join(["a"] * 256)).count("/") == 255


def test_an_upload_may_not_write_the_runtime_s_own_directory() -> None:
    for name in (".deckhands/baseline.git/config", "./.deckhands/x", "/workspace/.deckhands"):
        with pytest.raises(ArchiveRefused, match=r"\.deckhands/, which is deckhands' own"):
            _clean(_tar(_file(name, b"[core]\n")))
    with pytest.raises(ArchiveRefused, match="deckhands' own"):
        single_file_tar(".deckhands/x", io.BytesIO(b"x"), 1, io.BytesIO())
    assert [m.name for m in _clean(_tar(_file("a/.deckhands/x", b"x")))] == [
        "a",
        "a/.deckhands",
        "a/.deckhands/x",
    ]
