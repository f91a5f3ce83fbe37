"""What every part of the executor shares: its paths and limits, `log` and `Fail`.

On the boot path (the dispatcher imports it before the first ping): built-in modules only.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from shared.sandbox_protocol.messages import ErrorCode

WORKSPACE = os.environ.get("DECKHANDS_WORKSPACE", "/workspace")
STATE_DIR = os.environ.get("DECKHANDS_STATE_DIR", "/tmp/.deckhands")
KEPT_DIR = STATE_DIR + "/kept"
KEPT_NAMES = ("bash.out", "python.out", "read.out")
# Bytes of a kept file per `chunk` answer: JSON may escape a control character as 6 bytes, so
# even the worst piece stays well below the runtime's 1 MiB line limit.
CHUNK_BYTES = 128 * 1024
DEFAULT_LIMIT = 30_000
DEFAULT_TIMEOUT_S = 120.0
# The most a file operation reads into memory: the sandbox's memory is the agent's, and a file
# read whole (then cut for the answer) must not be what exhausts it.
READ_MAX_BYTES = 32 << 20


def log(message: str) -> None:
    sys.stderr.write(f"executor: {message}\n")
    sys.stderr.flush()


class Fail(Exception):
    """An error the caller should see, with a machine-readable code (ErrorReply's)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
