"""A task's events: pages of its log from the storage service, its trajectory, its live stream."""
