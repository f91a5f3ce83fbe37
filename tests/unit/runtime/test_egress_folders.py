"""The runtime's folders for the egress proxy (services/runtime/egress_folders.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from services.runtime.egress_folders import EgressFolders, proxy_environment
from services.runtime.errors import SandboxStartError
from shared.egress_policy import EgressPolicy, SandboxEgress

EGRESS = SandboxEgress(task_id="t1", tenant_id="acme", network=EgressPolicy(allow=("pypi.org",)))


def test_a_folder_holds_whose_sandbox_it_is_readable_by_the_sandbox_only_to_read(
    tmp_path: Path,
) -> None:
    token, path = EgressFolders(str(tmp_path)).make(EGRESS)
    folder = Path(path)
    assert folder == tmp_path / token and token.startswith("sbx-")
    assert SandboxEgress.model_validate_json((folder / "policy.json").read_text()) == EGRESS
    assert folder.stat().st_mode & 0o777 == 0o755
    assert (folder / "policy.json").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in folder.iterdir()) == ["policy.json"]  # no half-written file


def test_without_a_folder_to_share_a_policy_cannot_start() -> None:
    with pytest.raises(SandboxStartError, match="DECKHANDS_EGRESS_DIR"):
        EgressFolders(None).make(EGRESS)


def test_the_sweep_removes_only_old_folders_of_sandboxes_gone(tmp_path: Path) -> None:
    folders = EgressFolders(str(tmp_path))
    live, gone, young = (folders.make(EGRESS)[0] for _ in range(3))
    old = time.time() - 120
    for token in (live, gone):
        os.utime(tmp_path / token, (old, old))
    (tmp_path / ".mitmproxy").mkdir()  # the proxy's own: not a sandbox's
    assert folders.sweep({live}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, young, ".mitmproxy"])
    folders.remove(live)
    folders.remove("../escape")  # never outside the root
    assert not (tmp_path / live).exists()


def test_every_tool_finds_the_proxy_and_loopback_stays_inside() -> None:
    env = proxy_environment()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"
