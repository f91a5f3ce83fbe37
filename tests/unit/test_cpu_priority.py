"""The stack's accept path (gateway, NATS, Redis) gets a larger CPU share (tools/cpu_priority)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tools.cpu_priority import ACCEPT_PATH_NICE, favour, on_accept_path


def test_the_accept_path_by_the_stacks_names() -> None:
    assert all(on_accept_path(n) for n in ("gateway", "nats", "nats-0", "nats-2", "redis"))
    assert not any(on_accept_path(n) for n in ("controller", "reasoner-2", "runtime", "natsy"))


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a priority needs CAP_SYS_NICE")
def test_a_favoured_session_runs_at_the_raised_priority_in_every_thread() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import threading, time; threading.Thread(target=time.sleep, "
            "args=(30,), daemon=True).start(); time.sleep(30)",
        ],
        start_new_session=True,
    )
    try:
        assert favour(child.pid)
        threads = os.listdir(f"/proc/{child.pid}/task")
        assert len(threads) >= 1
        for tid in threads:
            assert os.getpriority(os.PRIO_PROCESS, int(tid)) == ACCEPT_PATH_NICE
        autogroup = f"/proc/{child.pid}/autogroup"
        if os.path.exists(autogroup):
            with open(autogroup) as f:
                assert f.read().strip().endswith(f"nice {ACCEPT_PATH_NICE}")
    finally:
        child.kill()
        child.wait(10)


def test_a_process_gone_is_not_favoured() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait(10)
    assert not favour(child.pid)
