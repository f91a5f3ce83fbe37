"""The seed task end to end on the local model: llama-cpp-python's server running
Qwen2.5-Coder-1.5B on the CPU, reached by the reasoner through litellm like any provider, with
every service, nats-server, redis-server and a Docker sandbox for real.

Slow (minutes on 2 cores). Skipped when the model or llama-cpp-python is not installed; it
never downloads or builds them: `python -m tools.local_llm ensure` does, once per machine.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from tools.local_llm import LocalLLMConfig, llm_env, start_server, wait_until_serving
from tools.local_llm.model import model_ready
from tools.procs import free_port
from tools.run_task import SEED_TASK, run_task
from tools.stack import Stack, StackConfig, running

CONFIG = LocalLLMConfig.from_env()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.docker,
    pytest.mark.skipif(
        not model_ready(CONFIG),
        reason=f"local model absent ({CONFIG.model_path}); `python -m tools.local_llm ensure`",
    ),
    pytest.mark.skipif(
        find_spec("llama_cpp") is None,
        reason="llama-cpp-python not installed; `python -m tools.local_llm ensure`",
    ),
]

# The seed task, worded so the check below has one exact line to look for.
TASK = f"{SEED_TASK}. Print each as a line like: 3 squared is 9"
TASK_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def local_llm_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = free_port()
    log = Path(tmp_path_factory.mktemp("local-llm")) / "server.log"
    proc = start_server(port, log, CONFIG)
    try:
        wait_until_serving(port, proc, timeout_s=300)
        yield port
    except Exception:
        print(log.read_text(errors="replace")[-3000:])
        raise
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except Exception:
            proc.kill()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, local_llm_port: int) -> Iterator[Stack]:
    run_dir = Path(tmp_path_factory.mktemp("stack"))
    config = StackConfig.isolated(
        run_dir,
        llm_port=local_llm_port,
        extra_env={**llm_env(local_llm_port), "DECKHANDS_POOL_MIN_IDLE": "1"},
    )
    with running(config) as stack:
        yield stack


def test_local_model_solves_the_seed_task(stack: Stack) -> None:
    out = io.StringIO()
    result = run_task(
        stack.config.gateway_url,
        TASK,
        timeout_s=TASK_TIMEOUT_S,
        out=out,
        api_key=stack.api_key,
    )
    transcript = out.getvalue()
    assert result["state"] == "FINISHED", transcript
    # The line was printed in the sandbox: a run/python output observation carries it.
    outputs = re.findall(r"(?:run_output|python_output)\s+(.*?)(?=\n#\d|\Z)", transcript, re.S)
    assert any("10 squared is 100" in text for text in outputs), transcript
