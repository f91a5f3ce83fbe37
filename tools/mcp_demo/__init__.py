"""A small MCP server of the project's own (stdio), for tests and for trying MCP tools out."""
