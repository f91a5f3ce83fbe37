"""The local OpenAI-compatible server, and how the reasoner reaches it through litellm."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import httpx

from .config import MODEL_ALIAS, LocalLLMConfig
from .model import LocalLLMError

__all__ = [
    "LITELLM_MODEL",
    "REASONER_SETTINGS",
    "llm_env",
    "server_command",
    "start_server",
    "wait_until_serving",
]

# litellm's name for it: "openai/" = any OpenAI-compatible server at DECKHANDS_LLM_API_BASE.
LITELLM_MODEL = f"openai/{MODEL_ALIAS}"

FIRST_LOOK = (
    "find . -maxdepth 3 -not -path './.git*' -not -name . | sort | head -100; n=0; "
    "find . -maxdepth 3 -type f -size -3k -not -path './.git/*' -print0 | sort -z | "
    "while IFS= read -r -d '' f; do s=$(stat -c %s \"$f\"); "
    '[ $((n + s)) -le 4000 ] && grep -Iq . "$f" || continue; n=$((n + s)); '
    'printf \'\\n==> %s <==\\n\' "${f#./}"; cat "$f"; done; true'
)

# Reasoner settings that suit this 1.5B model on 2 CPU cores (measured on the seed task).
REASONER_SETTINGS: dict[str, str] = {
    # Prompt-based tool calling: the tools are described in a short system prompt (~330
    # tokens) and the model answers with a JSON object, which it does reliably. Offered as
    # native tools, llama-cpp-python renders them through Qwen's template (~730 tokens) and
    # returns real tool calls only when one named function is forced; with "auto" (and
    # "required", which it ignores) the model writes the call as text, wrapped in tags, and
    # did not finish the seed task.
    "DECKHANDS_LLM_NATIVE_TOOL_CALLING": "false",
    # Asked for "a Python script", the 1.5B model ran a snippet in execute_python and wrote no
    # file; given a small task, it delegated it and reported the helper's failure (the eval's
    # squares and fix-calc tasks). Without those two it writes files and runs them itself.
    # The V1 tools (glob, grep, apply_patch, task_tracker; issue 29) cost it ~300 prompt
    # tokens and are held back until the evaluation shows they help it.
    "DECKHANDS_AGENT_WITHHELD_TOOLS": (
        '["execute_python", "delegate", "glob", "grep", "apply_patch", "task_tracker"]'
    ),
    # Its first action lists the working directory and prints its small text files, 4,000
    # bytes in all at most (no LLM call; the task's message ends with what it printed): not
    # shown them, the model ran the script it was asked to write, wrote over files it had not
    # read, and wrote a result from a JSON file it never opened.
    "DECKHANDS_AGENT_FIRST_LOOK": FIRST_LOOK,
    # ~8 tokens/s: a reply is a short tool call; cap runaway generations.
    "DECKHANDS_LLM_MAX_OUTPUT_TOKENS": "512",
    # A first turn evaluates the whole prompt at ~20-35 tokens/s on 2 busy cores.
    "DECKHANDS_LLM_TIMEOUT_S": "600",
}


def server_command(port: int, config: LocalLLMConfig | None = None) -> list[str]:
    """The command line that serves the local model on 127.0.0.1:`port`."""
    return (config or LocalLLMConfig.from_env()).server_argv(sys.executable, port)


def llm_env(port: int, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the services so the reasoner uses the local server on `port`. The
    tuning in REASONER_SETTINGS gives way to any of those variables already in `environ`."""
    environ = os.environ if environ is None else environ
    return {
        **{key: value for key, value in REASONER_SETTINGS.items() if key not in environ},
        "DECKHANDS_LLM_MODEL": LITELLM_MODEL,
        "DECKHANDS_LLM_API_BASE": f"http://127.0.0.1:{port}/v1",
        "DECKHANDS_LLM_API_KEY": "local",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }


def start_server(
    port: int, log: Path, config: LocalLLMConfig | None = None
) -> subprocess.Popen[bytes]:
    """Start the server in its own session (so a stack can stop its whole process group)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        server_command(port, config),
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_until_serving(
    port: int, proc: subprocess.Popen[bytes] | None = None, timeout_s: float = 180.0
) -> float:
    """Block until the server lists its model; returns the seconds it took."""
    started = time.monotonic()
    url = f"http://127.0.0.1:{port}/v1/models"
    last = "no answer"
    while time.monotonic() - started < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise LocalLLMError(f"the local LLM server exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError as exc:
            last = str(exc) or type(exc).__name__
        time.sleep(0.5)
    raise LocalLLMError(f"the local LLM server did not answer {url} in {timeout_s:.0f}s: {last}")
