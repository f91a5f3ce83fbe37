"""One stack for the console's tests (the browser's and the command line's): every service a
separate process on real nats-server, redis-server and Docker, the LLM the scripted server
playing tests/console/console_script.json."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.stack import Stack, StackConfig, running

SCRIPT = Path(__file__).parent / "console_script.json"


@pytest.fixture(scope="session")
def console_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("console"))
    config = StackConfig.isolated(
        run_dir,
        llm_script=SCRIPT,
        extra_env={
            "DECKHANDS_POOL_MIN_IDLE": "1",
            # The scripted model has no list price: give it one, so that cost shows and grows.
            "DECKHANDS_LLM_INPUT_COST_PER_TOKEN": "0.000001",
            "DECKHANDS_LLM_OUTPUT_COST_PER_TOKEN": "0.000002",
        },
    )
    with running(config) as stack:
        yield stack
