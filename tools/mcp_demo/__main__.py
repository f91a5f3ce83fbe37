"""`python -m tools.mcp_demo`: the demo MCP server on stdin/stdout (see server.py)."""

from .server import main

main()
