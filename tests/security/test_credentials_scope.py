"""Issue 24, finding 6: each local service holds only the credentials it uses.

`make up` (tools/stack.py) once gave every process the admin key and the key that seals
tenants' secrets: a service broken into (the reasoner, which talks to the LLM provider, or the
storage service) would have held both. The processes of the real stack are read as an operator
would (their environment in /proc) and each key is where deploy/k8s puts it, and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.stack import SCOPED_ENV, SERVICES, Stack

pytestmark = pytest.mark.docker


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode("utf-8", "replace") for k, v in pairs}


def test_each_service_holds_only_the_keys_it_uses(stack: Stack) -> None:
    assert SCOPED_ENV["DECKHANDS_ADMIN_API_KEY"] == ("gateway",)
    # The egress proxy reads the secrets bound to hosts (issue 27), and alone holds its CA's key.
    assert set(SCOPED_ENV["DECKHANDS_SECRETS_KEY"]) == {
        "gateway",
        "controller",
        "runtime",
        "egress",
    }
    assert SCOPED_ENV["DECKHANDS_EGRESS_CA_FILE"] == ("egress",)
    seen = 0
    for pid_file in sorted(stack.pids.glob("*.pid")):
        name = pid_file.stem
        service = next(
            (s for s in (*SERVICES, "egress") if name == s or name.startswith(f"{s}-")), None
        )
        env = _environ(int(pid_file.read_text()))
        for key, holders in SCOPED_ENV.items():
            if service in holders:
                continue
            assert key not in env, f"{name} holds {key}"
        if service == "gateway":
            assert env.get("DECKHANDS_ADMIN_API_KEY") and env.get("DECKHANDS_SECRETS_KEY")
        seen += 1
    assert seen >= len(SERVICES), list(stack.pids.glob("*.pid"))
