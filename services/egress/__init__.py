"""The egress proxy: the only way out of a sandbox whose task has a network policy (issue 27)."""
