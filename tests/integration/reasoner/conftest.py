"""The reasoner for real: its FastStream app on a nats-server of the module's own, litellm making
HTTP calls to the scripted LLM server running as a separate process, and a storage double that
answers history requests the way the storage service does (the peer's own tests cover it)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from reasoner_doubles import Harness, StorageDouble, reasoner_settings

from services.reasoner.main import build_app
from shared.settings import CommonSettings
from shared.subjects import HISTORY_SUBJECT
from tools.procs import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[3]
SEED_SCRIPT = ROOT / "tools" / "scripted_llm" / "scripts" / "seed_squares.json"

# Tasks whose text contains a key get that conversation; any other task gets the seed script.
EXTRA_CONVERSATIONS: list[dict[str, Any]] = [
    {
        "match": "malformed",
        "turns": [
            {"content": "Listing.", "tool": "execute_bash", "raw_arguments": '{"command": "ls'},
            {"tool": "finish", "arguments": {"message": "recovered after: {{last_tool_output}}"}},
        ],
    },
    {
        "match": "unknown tool",
        "turns": [
            {"tool": "browse_web", "arguments": {"url": "http://example.com"}},
        ],
    },
    {"match": "question", "turns": [{"content": "Which directory should I use?"}]},
    {
        "match": "flaky",
        "turns": [
            {
                "tool": "execute_bash",
                "arguments": {"command": "ls"},
                "fail_first": {"status": 503, "times": 1},
            },
        ],
    },
    {
        "match": "down for good",
        "turns": [
            {"content": "never", "fail_first": {"status": 500, "times": 1000}},
        ],
    },
    {
        "match": "json in text",
        "turns": [
            {"tool": "execute_python", "arguments": {"code": "print(6 * 7)"}, "as_text": True},
        ],
    },
]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


@pytest.fixture(scope="module")
def scripted_llm(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[str]:
    """`python -m tools.scripted_llm` on a free port; yields its base URL. A test module adds
    conversations of its own with a module-level SCRIPT_CONVERSATIONS list."""
    root = Path(tmp_path_factory.mktemp("scripted-llm"))
    seed = json.loads(SEED_SCRIPT.read_text())
    script = root / "script.json"
    conversations = [*getattr(request.module, "SCRIPT_CONVERSATIONS", []), *EXTRA_CONVERSATIONS]
    script.write_text(json.dumps({**seed, "conversations": conversations}))
    port = free_port()
    log = (root / "llm.log").open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.scripted_llm", "--script", str(script), "--port", str(port)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for_port(port, proc=proc)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        _stop(proc)
        log.close()


@pytest.fixture(scope="module")
async def harness(
    isolated_settings: CommonSettings, scripted_llm: str, request: pytest.FixtureRequest
) -> AsyncIterator[Harness]:
    """The reasoner app started in-process, the storage double, and a NATS client."""
    extra = getattr(request.module, "REASONER_SETTINGS", {})
    app = build_app(reasoner_settings(isolated_settings, scripted_llm, **extra))
    storage = StorageDouble()
    nc = await nats.connect(isolated_settings.nats_url)
    await nc.subscribe(HISTORY_SUBJECT, cb=storage.on_request)
    await app.start()
    try:
        yield Harness(nc, storage, scripted_llm, isolated_settings.redis_url)
    finally:
        await app.stop()
        await nc.close()
        await asyncio.sleep(0)
