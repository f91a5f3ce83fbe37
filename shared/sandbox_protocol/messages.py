"""Every executor operation's request and reply, as typed dicts (they are JSON lines on the wire).

Typed dicts rather than models: the executor, which runs on the standard library alone, uses
these same types (deploy/sandbox/executor/); the runtime checks each reply against its type
with pydantic (services/runtime/executor_client.py), and `tools/gen_schemas.py` writes their
JSON Schema to proto_schemas/sandbox_protocol.schema.json.

A request's `id` and `op` travel beside its fields; a reply repeats the `id`. Text is cut in
the middle to `limit` characters; with `keep` (bytes) the whole of a longer output is kept in
the sandbox under the name the reply gives (`kept`, `kept_bytes`) and fetched with `chunk`.
"""

from __future__ import annotations

from typing import Literal

try:
    from typing import NotRequired

    from typing_extensions import TypedDict
except ImportError:  # in the sandbox image: only the standard library (pydantic wants the other)
    from typing import NotRequired, TypedDict

__all__ = [
    "OPERATIONS",
    "BashReply",
    "BashRequest",
    "ChunkReply",
    "ChunkRequest",
    "CommitReply",
    "CommitRequest",
    "EditCommand",
    "EditReply",
    "EditRequest",
    "ErrorCode",
    "ErrorReply",
    "Op",
    "PackPiece",
    "PackReply",
    "PackRequest",
    "PingReply",
    "PingRequest",
    "PythonReply",
    "PythonRequest",
    "ReadReply",
    "ReadRequest",
    "ScanEntry",
    "ScanReply",
    "ScanRequest",
    "WriteReply",
    "WriteRequest",
]

Op = Literal["ping", "bash", "python", "read", "write", "edit", "chunk", "scan", "pack", "commit"]
EditCommand = Literal["view", "create", "str_replace", "insert", "undo"]

# Why the executor refused a request (ErrorReply.code). The runtime turns each into the
# ErrorObservation's error_code, so the agent sees it.
ErrorCode = Literal[
    "bad_request",  # a field is missing or malformed, or the op is unknown
    "bad_range",  # a line range outside the file
    "file_not_found",
    "not_found",  # a kept output already fetched or gone
    "is_a_directory",
    "not_a_regular_file",  # a device, fifo or socket where a file was meant
    "file_too_large",  # larger than the executor reads into memory
    "binary_file",
    "permission_denied",
    "no_space",  # the workspace is full
    "io_error",  # any other refusal of the kernel's
    "file_exists",  # `create` over an existing file
    "no_match",  # `str_replace`: old_str is not in the file
    "multiple_matches",  # `str_replace`: old_str is in the file more than once
    "nothing_to_undo",
    "shell_failed",  # the bash session could not be started
    "executor_error",  # the executor failed (its stderr has the traceback)
]


# --- requests ---------------------------------------------------------------------------------


class PingRequest(TypedDict):
    """Is the executor there, and which protocol does it speak?"""


class BashRequest(TypedDict):
    """A command for the sandbox's one bash session, or input for the command it runs."""

    command: str  # with is_input: keys for the running command ("C-c" and friends are keys)
    timeout_s: float  # then Ctrl-C, then the process group is killed, then the shell
    limit: NotRequired[int]
    keep: NotRequired[int]
    is_input: NotRequired[bool]
    no_output_timeout_s: NotRequired[float]  # answer early, still running, after this quiet
    env: NotRequired[dict[str, str]]  # exported for this command only (a task's secrets)


class PythonRequest(TypedDict):
    """A cell for the sandbox's one Python process, whose globals survive between cells."""

    code: str
    timeout_s: float
    limit: NotRequired[int]
    keep: NotRequired[int]
    env: NotRequired[dict[str, str]]


class ReadRequest(TypedDict):
    path: str  # relative to the workspace, or absolute
    start_line: NotRequired[int | None]  # 1-based, inclusive
    end_line: NotRequired[int | None]
    limit: NotRequired[int]
    keep: NotRequired[int]


class WriteRequest(TypedDict):
    path: str
    content: str


class EditRequest(TypedDict):
    """The OpenHands editor's commands: view, create, str_replace, insert, undo."""

    command: EditCommand
    path: str
    file_text: NotRequired[str | None]  # create
    old_str: NotRequired[str | None]  # str_replace
    new_str: NotRequired[str | None]  # str_replace, insert
    insert_line: NotRequired[int | None]  # insert: after this line; 0 is the top
    view_range: NotRequired[list[int] | None]  # view: [first, last], last -1 for the end
    limit: NotRequired[int]


class ChunkRequest(TypedDict):
    """A piece of a kept output, from byte `offset`, ending on a UTF-8 character boundary."""

    name: str
    offset: int
    size: NotRequired[int]
    drop: NotRequired[bool]  # remove the kept output once its last piece is read


class ScanRequest(TypedDict):
    """What changed in /workspace since the last commit (issue 28's checkpoints): a new scan,
    or with `scan` the page from entry `start` of the pending one."""

    full: NotRequired[bool]  # every path, not only the changed ones (the runtime lost its base)
    max_files: NotRequired[int]  # past it: too_large, no scan kept (0: no bound)
    max_bytes: NotRequired[int]  # bytes of all files (0: no bound)
    scan: NotRequired[str]
    start: NotRequired[int]


class PackRequest(TypedDict):
    """The bytes of `files` (workspace paths), from `start` in the first, up to `max_bytes`."""

    files: list[str]
    start: NotRequired[int]
    max_bytes: NotRequired[int]


class CommitRequest(TypedDict):
    """The runtime stored the pending scan: it is the base of the next one."""

    scan: str


# --- replies ----------------------------------------------------------------------------------


class PingReply(TypedDict):
    ok: Literal[True]
    pid: int
    protocol: int
    uptime_s: NotRequired[float]
    booting: NotRequired[bool]  # answered while the executor still loads its sessions


class BashReply(TypedDict):
    ok: Literal[True]
    output: str
    exit_code: int  # -1 while the command still runs
    cwd: str
    timed_out: bool
    running: bool  # the command still runs (quiet for no_output_timeout_s, or input refused)
    note: str  # what happened besides the output, for the agent ("" when nothing did)
    kept: NotRequired[str]
    kept_bytes: NotRequired[int]


class PythonReply(TypedDict):
    ok: Literal[True]
    output: str
    exit_code: int
    timed_out: bool
    note: str
    kept: NotRequired[str]
    kept_bytes: NotRequired[int]


class ReadReply(TypedDict):
    ok: Literal[True]
    path: str  # absolute
    content: str
    total_lines: int
    kept: NotRequired[str]
    kept_bytes: NotRequired[int]


class WriteReply(TypedDict):
    ok: Literal[True]
    path: str
    size: int  # bytes written
    # The file it replaced: its size, and whether it held exactly these bytes already. Absent
    # for a new file (and from executors older than the field).
    previous_size: NotRequired[int]
    unchanged: NotRequired[bool]


class EditReply(TypedDict):
    ok: Literal[True]
    path: str
    content: str  # what was done, or what `view` shows
    diff: str  # unified, cut to limit; "" for view


class ChunkReply(TypedDict):
    ok: Literal[True]
    data: str
    next: int  # the offset of the next piece
    eof: bool


class ScanEntry(TypedDict):
    """A path of the workspace as it is now."""

    p: str  # relative to /workspace
    t: Literal["f", "d", "l"]  # a regular file, a directory, a symbolic link
    m: int  # permission bits
    s: int  # size in bytes
    h: str  # a file's SHA-256 (hex), a link's target; "" for a directory


class ScanReply(TypedDict):
    ok: Literal[True]
    scan: str  # the pending scan's id ("" when too_large)
    changed: list[ScanEntry]  # new or changed paths (every path if `full`), this page's
    deleted: list[str]  # paths gone since the base (on the first page only)
    more: bool  # more pages of `changed`
    total: int  # changed paths in all pages
    files: int  # paths in the workspace
    bytes: int  # bytes of all its files
    skipped: int  # paths not kept: unreadable, not UTF-8, or neither file, folder nor link
    too_large: bool  # past max_files or max_bytes: nothing scanned is kept


class PackPiece(TypedDict):
    i: int  # index into the request's files
    n: int  # bytes of it in `data`, after the previous piece's
    end: bool  # the file's last bytes
    error: NotRequired[str]  # it could not be read (gone, replaced by a link...)


class PackReply(TypedDict):
    ok: Literal[True]
    data: str  # base64 of the pieces' bytes, one after another
    pieces: list[PackPiece]


class CommitReply(TypedDict):
    ok: Literal[True]


class ErrorReply(TypedDict):
    """Any operation's refusal."""

    ok: Literal[False]
    code: ErrorCode
    error: str


# Each operation's request and reply types: the executor routes by it, the runtime checks
# replies by it, and the JSON Schema is generated from it.
OPERATIONS: dict[str, tuple[type, type]] = {
    "ping": (PingRequest, PingReply),
    "bash": (BashRequest, BashReply),
    "python": (PythonRequest, PythonReply),
    "read": (ReadRequest, ReadReply),
    "write": (WriteRequest, WriteReply),
    "edit": (EditRequest, EditReply),
    "chunk": (ChunkRequest, ChunkReply),
    "scan": (ScanRequest, ScanReply),
    "pack": (PackRequest, PackReply),
    "commit": (CommitRequest, CommitReply),
}
