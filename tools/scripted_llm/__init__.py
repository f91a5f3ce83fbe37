"""A scripted OpenAI-compatible chat server: deterministic "LLM" answers for tests and demos.

See `tools.scripted_llm.server` for the script format and `python -m tools.scripted_llm --help`.
"""

from .server import Script, ScriptedLLMServer, ScriptError, load_script

__all__ = ["Script", "ScriptError", "ScriptedLLMServer", "load_script"]
