"""A local LLM for when no provider is configured: Qwen2.5-Coder-1.5B-Instruct (Apache-2.0,
Q4_K_M GGUF) served on the CPU by llama-cpp-python's OpenAI-compatible server.

`python -m tools.local_llm ensure` fetches and builds what it needs once per machine (cache:
~/.cache/deckhands, or DECKHANDS_LOCAL_LLM_CACHE); `python -m tools.local_llm serve --port N`
runs the server. tools/stack.py uses `ensure()`, `start_server()` and `llm_env()`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .config import MODEL_ALIAS, MODEL_LICENSE, LocalLLMConfig
from .model import LocalLLMError, ensure_model, model_ready
from .server import (
    LITELLM_MODEL,
    REASONER_SETTINGS,
    llm_env,
    server_command,
    start_server,
    wait_until_serving,
)
from .server_package import ensure_llama_cpp, llama_cpp_installed

__all__ = [
    "LITELLM_MODEL",
    "MODEL_ALIAS",
    "MODEL_LICENSE",
    "REASONER_SETTINGS",
    "LocalLLMConfig",
    "LocalLLMError",
    "available",
    "ensure",
    "llm_env",
    "server_command",
    "start_server",
    "wait_until_serving",
]


def ensure(config: LocalLLMConfig | None = None, say: Callable[[str], None] = print) -> Path:
    """Make the local model servable (model file + llama-cpp-python); returns the model path.
    Idempotent: after the first run it only checks what is cached."""
    config = config or LocalLLMConfig.from_env()
    model = ensure_model(config, say)
    ensure_llama_cpp(config, say)
    return model


def available(config: LocalLLMConfig | None = None) -> bool:
    """Everything is in place to serve the model, without fetching or building anything."""
    config = config or LocalLLMConfig.from_env()
    return model_ready(config) and llama_cpp_installed()
