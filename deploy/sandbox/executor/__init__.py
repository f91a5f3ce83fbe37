"""deckhands' in-sandbox executor, run as the sandbox user (uid 1000) by holder.py.

Standard library only. In the image it sits in /opt/deckhands beside holder.py and the
sandbox contract, shared/sandbox_protocol/, its only import from the project.

Protocol: one JSON object per line. Requests arrive on stdin, responses leave on stdout (the
runtime reaches both through `docker attach`; no `docker exec`, no port). In the sandbox these
are pipes to holder.py, which alone (with root's docker-init and tini) holds the channel itself.
Every request has an `id` and an `op` (ping, bash, python, read, write, edit, chunk, and
scan, pack, commit for checkpoints); its
response carries the same `id` and `ok`, and a refusal has `code` and `error`. The fields of
every request and reply are typed in shared/sandbox_protocol/messages.py. Diagnostics go to
stderr (the container's capped log), never to stdout.

State that lives as long as the sandbox: one bash session in a pseudo-terminal (cwd, variables,
functions and background jobs survive between commands; bash.py), and one Python process whose
globals survive between cells (kernel.py). A cut output is kept whole for the runtime to fetch
with `chunk` (output.py, files.py). A task's secrets arrive as `env`, beside a command or cell,
never in its code (`BashSession.ENV_PRELUDE`).

The modules: dispatcher (the main loop; answers pings while the rest loads), workers (a thread
per session), bash, kernel, files, snapshot, output, processes, space, config.
"""

from __future__ import annotations

__all__ = ["main"]


def main() -> None:
    """Serve requests from stdin until it closes."""
    # Imported here, not above: the Python process imports this package for kernel.py alone.
    from .dispatcher import main as serve

    serve()
