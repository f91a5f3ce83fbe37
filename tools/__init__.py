"""Developer and operator tools: the local stack runner and the scripted LLM server."""
