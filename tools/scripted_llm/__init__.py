"""A scripted OpenAI-compatible chat server: deterministic "LLM" answers for tests and demos.

`python -m tools.scripted_llm --help` runs it. The server and its endpoints are
`tools.scripted_llm.server`; the script format, `.script`; which turn answers a request, and the
reply made of it, `.responder`; a provider's limits, `.limits`.
"""

from .script import Script, ScriptError, load_script
from .server import ScriptedLLMServer

__all__ = ["Script", "ScriptError", "ScriptedLLMServer", "load_script"]
