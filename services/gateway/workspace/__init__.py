"""A task's workspace in and out, the repository it starts from, the blobs its events refer to."""
