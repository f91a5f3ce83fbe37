"""`make down` (tools.stack's down) leaves no container and no workspace volume of its pool,
even when the runtime was killed and never cleaned up after itself."""

from __future__ import annotations

import json
import time
from pathlib import Path

import docker
import httpx
import pytest

from tools.stack import StackConfig, running

pytestmark = pytest.mark.docker


def test_down_leaves_no_container_and_no_volume(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            {
                "model": "scripted",
                "turns": [
                    {"tool": "execute_bash", "arguments": {"command": "echo x > /workspace/x"}},
                    {"content": "Anything else?"},
                ],
            }
        )
    )
    config = StackConfig.isolated(tmp_path / "run", llm_script=script)
    label = f"deckhands.pool={config.pool_name}"
    client = docker.from_env(timeout=60)
    try:
        with (
            running(config) as stack,
            httpx.Client(
                base_url=stack.config.gateway_url, headers=stack.auth_headers, timeout=30
            ) as http,
        ):
            ids = [http.post("/v1/tasks", json={"task": f"t{i}"}).json()["id"] for i in range(3)]
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                states = [http.get(f"/v1/tasks/{t}").json()["state"] for t in ids]
                if all(s == "AWAITING_USER_INPUT" for s in states):
                    break
                time.sleep(0.3)
            assert all(s == "AWAITING_USER_INPUT" for s in states), states
            assert len(client.volumes.list(filters={"label": label})) >= 3
            stack.kill_service("runtime")  # a crash: nothing cleaned up by the runtime itself
        assert client.containers.list(all=True, filters={"label": label}) == []
        assert client.volumes.list(filters={"label": label}) == []
    finally:
        client.close()
