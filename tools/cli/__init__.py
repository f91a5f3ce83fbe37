"""The `deckhands` command: post tasks, follow them, steer them (issue 13)."""
