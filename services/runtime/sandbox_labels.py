"""What makes a container one of the pool's sandboxes: its labels and its name.

Labels cannot change after creation; they say whose a container is (role, pool, replica, image,
network). The name does change: `deckhands-idle-<random>` while in the pool,
`deckhands-task-<task>` once bound to a task.
"""

from __future__ import annotations

import hashlib
import re

__all__ = [
    "IDLE_PREFIX",
    "LABEL_EGRESS",
    "LABEL_IMAGE",
    "LABEL_NETWORK",
    "LABEL_POOL",
    "LABEL_REPLICA",
    "LABEL_ROLE",
    "NO_NETWORK",
    "ROLE_SANDBOX",
    "TASK_PREFIX",
    "sandbox_labels",
    "task_container_name",
]

LABEL_ROLE = "deckhands.role"
ROLE_SANDBOX = "sandbox"
LABEL_POOL = "deckhands.pool"
LABEL_REPLICA = "deckhands.replica"
LABEL_IMAGE = "deckhands.image"
LABEL_NETWORK = "deckhands.network"
# The sandbox's folder for the egress proxy (egress_folders.py), if its task has a policy.
LABEL_EGRESS = "deckhands.egress"
NO_NETWORK = "none"
IDLE_PREFIX = "deckhands-idle-"
TASK_PREFIX = "deckhands-task-"
_NAME_SAFE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,100}$")


def task_container_name(task_id: str) -> str:
    """The container name of a task's sandbox; ids Docker would refuse are hashed."""
    if _NAME_SAFE.match(task_id):
        return TASK_PREFIX + task_id
    return TASK_PREFIX + "h" + hashlib.sha256(task_id.encode()).hexdigest()[:32]


def sandbox_labels(
    pool: str, replica: str, image: str, network: str, egress_token: str | None = None
) -> dict[str, str]:
    """The labels of a sandbox: whose pool and replica it is, its image and network, and its
    folder for the egress proxy if its task has a network policy."""
    labels = {
        LABEL_ROLE: ROLE_SANDBOX,
        LABEL_POOL: pool,
        LABEL_REPLICA: replica,
        LABEL_IMAGE: image,
        LABEL_NETWORK: network,
    }
    return labels | ({LABEL_EGRESS: egress_token} if egress_token else {})
