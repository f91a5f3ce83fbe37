"""A tenant's quotas: the limits in force, and the counts that admit a task or refuse it."""
