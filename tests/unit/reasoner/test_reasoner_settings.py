"""The reasoner's settings: read from DECKHANDS_LLM_* variables, the key kept secret."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from services.reasoner.main import build_app
from services.reasoner.settings import ReasonerSettings


def test_llm_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DECKHANDS_LLM_MODEL", "openai/scripted")
    monkeypatch.setenv("DECKHANDS_LLM_API_BASE", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("DECKHANDS_LLM_API_KEY", "sk-very-secret-key")
    monkeypatch.setenv("DECKHANDS_LLM_NATIVE_TOOL_CALLING", "FALSE")
    monkeypatch.setenv("DECKHANDS_LLM_TIMEOUT_S", "7.5")
    monkeypatch.setenv("DECKHANDS_LLM_NUM_RETRIES", "1")
    monkeypatch.setenv("DECKHANDS_LLM_MAX_OUTPUT_TOKENS", "256")
    monkeypatch.setenv("DECKHANDS_LLM_TEMPERATURE", "0.2")
    settings = ReasonerSettings()
    assert settings.llm_model == "openai/scripted"
    assert settings.llm_native_tool_calling == "false"
    assert (settings.llm_timeout_s, settings.llm_num_retries) == (7.5, 1)
    assert (settings.llm_max_output_tokens, settings.llm_temperature) == (256, 0.2)
    assert settings.llm_api_key is not None
    assert settings.llm_api_key.get_secret_value() == "sk-very-secret-key"
    assert "sk-very-secret-key" not in repr(settings) and "sk-very" not in str(settings)
    settings.require_llm()


@pytest.mark.parametrize(("raw", "value"), [("1", "true"), ("yes", "true"), ("Auto", "auto")])
def test_tool_calling_mode_accepts_common_spellings(raw: str, value: str) -> None:
    given: dict[str, Any] = {"llm_native_tool_calling": raw}
    assert ReasonerSettings(**given).llm_native_tool_calling == value


def test_bad_values_are_refused_with_their_name() -> None:
    bad: dict[str, Any] = {"llm_native_tool_calling": "maybe"}
    with pytest.raises(ValidationError, match="llm_native_tool_calling"):
        ReasonerSettings(**bad)
    with pytest.raises(ValidationError, match="llm_timeout_s"):
        ReasonerSettings(llm_timeout_s=0)


def test_a_missing_model_stops_start_up_but_not_building_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DECKHANDS_LLM_MODEL", raising=False)
    settings = ReasonerSettings()
    assert build_app(settings).broker is not None  # the AsyncAPI generator builds it offline
    with pytest.raises(RuntimeError, match="DECKHANDS_LLM_MODEL"):
        settings.require_llm()
