"""runtime-executor: runs approved actions in hardened Docker sandboxes from a warm pool."""
