#!/usr/bin/env python3
"""The holder of the executor's channel: the only sandbox process the agent cannot reach.

The runtime talks to the executor over the container's attached stdin/stdout. Every process
that holds those descriptors can read the runtime's requests (and their ids) or forge answers,
and any process of the same uid that stays dumpable hands them to the agent through
/proc/<pid>/fd. So the channel is held only by processes of other uids:

  docker-init, tini   root (the container's user), never touched by the agent
  holder (this file)  starts as root, forks the executor, then becomes CHANNEL_UID (999) with
                      no capabilities left, and only copies bytes between the channel and the
                      executor's pipes
  executor            AGENT_UID (1000), like every command it runs; its stdin/stdout are pipes
                      to the holder, never the channel, and it is not dumpable

uid 1000 can neither open another uid's /proc/<pid>/fd (ptrace access is refused across uids)
nor signal it. The agent can still kill its own executor: the holder then exits, and the
runtime sees its sandbox lost, as before.

Needs CAP_SETUID and CAP_SETGID (the runtime adds only those two); the setuid to a non-root uid
clears every capability of both processes. Run by a non-root user (the unit tests, a manual
`docker run` with the image's default user), it runs the executor in-process, unprotected.

Standard library only, built-in modules only: it runs before anything else in every sandbox.
"""

from __future__ import annotations

import _thread
import os
import sys

__all__ = ["main"]

AGENT_UID = int(os.environ.get("DECKHANDS_AGENT_UID", "1000"))
CHANNEL_UID = int(os.environ.get("DECKHANDS_CHANNEL_UID", "999"))
_CHUNK = 65536
# The environment variables that configure the holder are not the agent's business.
_OWN_ENV = ("DECKHANDS_AGENT_UID", "DECKHANDS_CHANNEL_UID")


def _log(message: str) -> None:
    os.write(2, f"holder: {message}\n".encode())


def _become(uid: int) -> None:
    """Drop to `uid` for good: groups, gid, then uid (which clears every capability)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _not_dumpable() -> None:
    # The uid change already made this process non-dumpable unless the host sets
    # fs.suid_dumpable=1; say it explicitly (PR_SET_DUMPABLE = 4) so no host setting undoes it.
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
    except Exception as exc:  # the uid separation alone still keeps the agent out
        _log(f"cannot clear the dumpable flag: {exc}")


def _copy(src: int, dst: int) -> None:
    """Copy bytes from src to dst until either side ends; never holds more than one chunk."""
    try:
        while True:
            data = os.read(src, _CHUNK)
            if not data:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(dst, view) :]
    except OSError:
        return


def _start_egress_relay() -> None:
    """A task with a network policy: 127.0.0.1:3128 to the egress proxy (egress_relay.py),
    run by this uid, so the agent can neither stop nor replace it."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import egress_relay

    if os.path.isdir(egress_relay.FOLDER):
        _thread.start_new_thread(egress_relay.serve, ())


# A task whose secrets the egress proxy adds to its HTTPS requests: the deployment's egress CA,
# put in the sandbox's folder by the runtime (services/runtime/egress_folders.py), and the bundle
# that adds it to the system's, in a tmpfs of root's (the root filesystem is read-only), which
# the runtime points SSL_CERT_FILE, PIP_CERT, GIT_SSL_CAINFO... at (shared/egress_policy.py).
_EGRESS_CA = "/run/deckhands/egress/ca.crt"
_SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_TRUST_BUNDLE = "/run/deckhands/trust/ca-certificates.crt"


def _trust_egress_ca() -> None:
    """Write the bundle as root (0644: the agent reads it and cannot change it)."""
    try:
        with open(_EGRESS_CA, "rb") as ca:
            pem = ca.read()
    except OSError:
        return
    try:
        with open(_SYSTEM_BUNDLE, "rb") as system:
            bundle = system.read()
    except OSError:
        bundle = b""
    try:
        fd = os.open(_TRUST_BUNDLE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with open(fd, "wb") as out:
            out.write(bundle + b"\n" + pem)
    except OSError as exc:
        _log(f"cannot write {_TRUST_BUNDLE}: {exc}")


def _run_executor() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import executor

    executor.main()


def main() -> None:
    for name in _OWN_ENV:
        os.environ.pop(name, None)
    if os.getuid() != 0:
        _log(f"running as uid {os.getuid()}, not root: the channel is not separated")
        _run_executor()
        return
    _trust_egress_ca()
    to_executor_r, to_executor_w = os.pipe()
    from_executor_r, from_executor_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(to_executor_r, 0)
            os.dup2(from_executor_w, 1)
            for fd in (to_executor_r, to_executor_w, from_executor_r, from_executor_w):
                os.close(fd)
            # From here on nothing of this process reaches the channel; the uid change also
            # makes it non-dumpable (the executor sets that again before any agent code runs).
            _become(AGENT_UID)
        except OSError as exc:
            _log(f"cannot become uid {AGENT_UID} (needs CAP_SETUID and CAP_SETGID): {exc}")
            os._exit(70)
        _run_executor()
        os._exit(0)
    os.close(to_executor_r)
    os.close(from_executor_w)
    try:
        _become(CHANNEL_UID)
    except OSError as exc:
        _log(f"cannot become uid {CHANNEL_UID}: {exc}")
        os._exit(70)

    def requests() -> None:
        _copy(0, to_executor_w)
        # The runtime closed stdin (or the executor is gone): the executor sees end of input.
        os.close(to_executor_w)

    _thread.start_new_thread(requests, ())
    _not_dumpable()
    _start_egress_relay()
    _copy(from_executor_r, 1)
    # The executor closed its stdout: it exited, or the agent killed it. Its sandbox is lost.
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    _log(f"the executor ended ({code}); exiting")
    os._exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
