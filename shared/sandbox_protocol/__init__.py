"""The sandbox boundary: what the runtime and the in-sandbox executor say to each other.

One JSON object per line. A request is `{"id": ..., "op": ..., **fields}` and its reply carries
the same `id` and `ok`; `messages.py` types the fields of every operation's request and reply,
and `session.py` is the runtime's side of it, `SandboxSession` (what a sandbox can be asked),
with the two ways a call fails. The executor (deploy/sandbox/executor/) is the other side.

This package is copied into the sandbox image beside the executor, which runs on the standard
library alone and counts its start-up time: this module is all the executor imports before it
answers its first ping, so it holds the version and nothing else.
"""

from __future__ import annotations

__all__ = ["PROTOCOL_VERSION"]

# What a ping answers. The runtime checks it once per sandbox and refuses an executor that
# speaks another version (an image built from other sources). 2: `env` on bash and python;
# 3: `scan`, `pack` and `commit` (checkpoints of /workspace).
PROTOCOL_VERSION = 3
