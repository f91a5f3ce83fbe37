"""Paths in a workspace: relative to /workspace, normalised, and refused when they leave it.

What a workspace request's path and every entry of an uploaded archive go through before they
reach the sandbox; the runtime's own `.deckhands/` directory (an uploaded tree's baseline) is no
upload's to write.
"""

from __future__ import annotations

from .errors import ArchiveRefused

__all__ = ["STATE_DIR", "check_path", "check_upload_path"]

STATE_DIR = ".deckhands"  # the runtime's own files in a workspace (an uploaded tree's baseline)
# Linux's NAME_MAX, and PATH_MAX less "/workspace/"; the depth is far beyond any real tree's.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096 - len("/workspace/") - 1
MAX_PATH_DEPTH = 256


def check_path(path: str) -> str:
    """A path relative to /workspace, normalised; refused if it leaves it.

    `/workspace/x` and `x` name the same file; `..`, an absolute path elsewhere, an empty
    path and control characters are refused.
    """
    if not path or "\x00" in path or any(ord(c) < 32 for c in path):
        raise ArchiveRefused("the path is empty or holds control characters")
    if path == "/workspace" or path.startswith("/workspace/"):
        path = path[len("/workspace") :].lstrip("/")
    elif path.startswith("/"):
        raise ArchiveRefused(f"the path {path!r} is outside /workspace")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts:
        raise ArchiveRefused("the path names /workspace itself, not a file in it")
    if ".." in parts:
        raise ArchiveRefused(f"the path {path!r} leaves /workspace ('..' is refused)")
    # Past these the kernel would refuse it (ENAMETOOLONG) deep in Docker, slowly and in the
    # engine's words.
    if len(parts) > MAX_PATH_DEPTH:
        raise ArchiveRefused(
            f"the path is {len(parts)} levels deep, more than the limit of {MAX_PATH_DEPTH}"
        )
    longest = max(len(p.encode()) for p in parts)
    if longest > MAX_NAME_BYTES:
        raise ArchiveRefused(
            f"a name in the path is {longest} bytes long, more than the limit of {MAX_NAME_BYTES}"
        )
    joined = "/".join(parts)
    if len(joined.encode()) > MAX_PATH_BYTES:
        raise ArchiveRefused(
            f"the path is {len(joined.encode())} bytes long, more than the limit of "
            f"{MAX_PATH_BYTES}"
        )
    return joined


def check_upload_path(path: str) -> str:
    """check_path, and not in the runtime's own `.deckhands/` (an uploaded tree's baseline)."""
    name = check_path(path)
    if name.split("/", 1)[0] == STATE_DIR:
        raise ArchiveRefused(
            f"{path!r} is in {STATE_DIR}/, which is deckhands' own: an upload may not write it"
        )
    return name
