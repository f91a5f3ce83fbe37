"""security-monitor: rules on every runnable action before the runtime may see it."""
