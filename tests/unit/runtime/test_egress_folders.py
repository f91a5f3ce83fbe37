"""The runtime's folders for the egress proxy (services/runtime/egress_folders.py)."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.runtime.egress_folders import EgressFolders, proxy_environment
from services.runtime.egress_settings import EgressFolderSettings
from services.runtime.egress_stores import HELPER_PROGRAM, LocalFolders
from services.runtime.errors import SandboxStartError
from shared.egress_policy import EgressPolicy, SandboxEgress

EGRESS = SandboxEgress(task_id="t1", tenant_id="acme", network=EgressPolicy(allow=("pypi.org",)))


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _folders(root: Path) -> EgressFolders:
    return EgressFolders(LocalFolders(str(root)))


async def test_a_folder_holds_whose_sandbox_it_is_readable_by_the_sandbox_only_to_read(
    tmp_path: Path,
) -> None:
    token, path = await _folders(tmp_path).make(EGRESS)
    folder = Path(path)
    assert folder == tmp_path / token and token.startswith("sbx-")
    assert SandboxEgress.model_validate_json(_read(folder / "policy.json")) == EGRESS
    assert os.stat(folder).st_mode & 0o777 == 0o755
    assert os.stat(folder / "policy.json").st_mode & 0o777 == 0o644
    assert sorted(os.listdir(folder)) == ["policy.json"]  # no half-written file


async def test_without_a_folder_to_share_a_policy_cannot_start() -> None:
    with pytest.raises(SandboxStartError, match="DECKHANDS_EGRESS_DIR"):
        await EgressFolders(None).make(EGRESS)


async def test_a_policy_is_rewritten_only_when_it_changed(tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    token, path = await folders.make(EGRESS)
    assert not await folders.refresh(token, EGRESS)
    wider = EGRESS.model_copy(update={"network": EgressPolicy(allow=("pypi.org", "x.org"))})
    assert await folders.refresh(token, wider)
    assert SandboxEgress.model_validate_json(_read(Path(path) / "policy.json")) == wider
    assert not await folders.refresh("../" + token, wider)  # never outside the root


async def test_the_sweep_removes_only_old_folders_of_sandboxes_gone(tmp_path: Path) -> None:
    folders = _folders(tmp_path)
    live, gone, young = [(await folders.make(EGRESS))[0] for _ in range(3)]
    old = time.time() - 120
    for token in (live, gone):
        os.utime(tmp_path / token, (old, old))
    os.mkdir(tmp_path / ".mitmproxy")  # the proxy's own: not a sandbox's
    assert await folders.sweep({live}) == 1
    assert sorted(os.listdir(tmp_path)) == sorted([live, young, ".mitmproxy"])
    await folders.remove(live)
    await folders.remove("../escape")  # never outside the root
    assert live not in os.listdir(tmp_path)


def test_every_tool_finds_the_proxy_and_loopback_stays_inside() -> None:
    env = proxy_environment()
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        assert env[name] == "http://127.0.0.1:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "localhost,127.0.0.1,::1"


def test_a_runtime_keeps_its_folders_in_one_place_or_says_why_it_cannot() -> None:
    both = {"egress_dir": "/srv/egress", "egress_engine_dir": "/var/run/deckhands-egress"}
    with pytest.raises(ValueError, match="both set"):
        EgressFolderSettings(**both)
    with pytest.raises(ValueError, match="not absolute"):
        EgressFolderSettings(egress_engine_dir="run/egress")
    assert EgressFolderSettings(egress_engine_dir="/var/run/deckhands-egress").egress_folders_kept
    assert not EgressFolderSettings().egress_folders_kept


def test_the_engine_helpers_program_does_each_change_and_refuses_what_is_not_one(
    tmp_path: Path,
) -> None:
    """The program the helper container runs (egress_stores.HELPER_PROGRAM), run here on its
    own: one JSON request per line in, one answer with its id per line out."""
    token, other = "sbx-" + "a" * 16, "sbx-" + "b" * 16
    policy = base64.b64encode(b'{"task_id": "t1"}').decode()
    asks = [
        {
            "id": 1,
            "op": "make",
            "token": token,
            "owner": os.getuid(),
            "files": [["policy.json", policy]],
        },
        {"id": 2, "op": "write", "token": token, "name": "p.json", "data": policy},
        {"id": 3, "op": "make", "token": "../escape", "owner": 0, "files": []},
        {"id": 4, "op": "write", "token": token, "name": "../../x", "data": policy},
        {"id": 5, "op": "make", "token": other, "owner": os.getuid(), "files": []},
        {"id": 6, "op": "sweep", "min_age_s": 0, "live": [token]},
        {"id": 7, "op": "remove", "token": token},
        {"id": 8, "op": "rm -rf /"},
    ]
    done = subprocess.run(
        [sys.executable, "-c", HELPER_PROGRAM, str(tmp_path)],
        input="\n".join(json.dumps(a) for a in asks) + "\nnot json\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(a["id"], a["ok"]) for a in answers] == [
        (1, True),
        (2, True),
        (3, False),
        (4, False),
        (5, True),
        (6, True),
        (7, True),
        (8, False),
        (None, False),
    ], answers
    assert answers[5]["removed"] == 1  # the other folder, not the live one
    assert "unknown op" in answers[7]["error"]
    assert os.listdir(tmp_path) == []
