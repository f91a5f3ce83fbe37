"""The runtime-executor's settings: DECKHANDS_* environment variables, checked at start-up."""

from __future__ import annotations

import socket

from pydantic import Field, field_validator, model_validator

from shared.settings import CommonSettings
from shared.subjects import replica_token

from .checkpoint_settings import CheckpointSettings
from .egress_settings import EgressFolderSettings
from .sizes import SIZE, SandboxSizes, size_bytes

__all__ = ["RuntimeSettings", "size_bytes"]


class RuntimeSettings(CommonSettings, CheckpointSettings, EgressFolderSettings, SandboxSizes):
    """Sandbox pool, hardening and execution limits (env: DECKHANDS_<NAME>, e.g.
    DECKHANDS_SANDBOX_IMAGE, DECKHANDS_POOL_MIN_IDLE)."""

    # -- which replica this is
    runtime_replica: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="This replica's name, which its Docker engine's sandboxes are reached by: "
        "a task's orders are routed to the replica holding its sandbox (one queue per name). "
        "Processes sharing one engine may share a name. Kubernetes: the node's name "
        "(DaemonSet on the node's engine) or the pod's (its own Docker-in-Docker). Unset: the "
        "host's name. Characters other than letters, digits, '_' and '-' become '_'.",
    )
    replica_ttl_s: int = Field(
        default=30,
        ge=3,
        le=3600,
        description="A replica sends a heartbeat every third of this; one silent for this "
        "long is gone: an order for a task whose sandbox it held is taken by another replica "
        "(which adopts the sandbox when it shares the engine, else reports the workspace lost), "
        "and after as long again the orders queued for it are handed to the others.",
    )

    workspace_forward_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long a replica waits for the replica holding a task's sandbox to "
        "answer a workspace request it passed on (the gateway waits "
        "DECKHANDS_WORKSPACE_TIMEOUT_S in all).",
    )

    # -- image and pool
    sandbox_image: str = Field(
        default="deckhands/sandbox:latest",
        description="Sandbox image; build it with deploy/sandbox/build.sh.",
    )
    max_sandboxes: int = Field(
        default=100,
        ge=1,
        description="Tasks holding a sandbox at once, across every runtime replica and restart "
        "(seats in Redis). A task beyond it waits in the fair queue (shared/admission.py: each "
        "freed seat to the tenant furthest below its weighted share), holding nothing, until a "
        "task ends; warm idle sandboxes are on top (pool_max_idle per replica).",
    )
    pool_min_idle: int = Field(
        default=2,
        ge=0,
        description="Ready sandboxes kept waiting for new tasks. While a backlog queues, these "
        "last ones are left to a task that goes ahead of it (another tenant's, an interactive "
        "one): the backlog's own tasks get sandboxes started for them or the pool's surplus.",
    )
    pool_max_idle: int = Field(
        default=16,
        ge=0,
        description="Upper bound of ready sandboxes when scaling up for a burst of new tasks.",
    )
    pool_max_total: int = Field(
        default=120,
        ge=1,
        description="Most sandboxes (idle + busy + starting) one runtime replica keeps; an "
        "acquisition beyond it waits for a task to end.",
    )
    docker_threads: int = Field(
        default=32,
        ge=2,
        le=256,
        description="Threads for blocking Docker API calls (concurrent creates, removals, ...).",
    )
    pool_create_concurrency: int = Field(
        default=4,
        ge=1,
        description="Sandboxes the pool starts in parallel to refill itself, besides those "
        "its callers start for themselves.",
    )
    sandbox_start_concurrency: int = Field(
        default=3,
        ge=1,
        description="Sandboxes this replica's engine is asked to start at once; the others "
        "wait for a slot, handed out fairly between tenants (with the pool's refills as one "
        "more). The engine starts as many a second from 2 at once as from 16, each the "
        "slower the more run beside it: a few at once keeps every start quick.",
    )
    pool_scale_window_s: float = Field(
        default=60.0,
        gt=0,
        description="Window over which the recent acquisition rate is measured for scaling.",
    )
    pool_scale_down_after_s: float = Field(
        default=120.0,
        ge=0,
        description="Idle sandboxes above the target are removed after the surplus lasted "
        "this long.",
    )
    pool_health_interval_s: float = Field(
        default=30.0, gt=0, description="How often idle sandboxes are pinged and reconciled."
    )
    acquire_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description="How long an action waits for a sandbox when the pool is at max_total.",
    )
    start_timeout_s: float = Field(
        default=30.0, gt=0, description="A new sandbox must answer its first ping by then."
    )
    max_starting_sandboxes: int = Field(
        default=8,
        ge=0,
        description="Seated tasks whose sandbox is still starting, across every replica; the "
        "next seat waits until one started (0: no such limit). Seats go at the pace the engine "
        "starts sandboxes (it starts a few at once as fast as many); a tenant with none "
        "starting still takes a free seat, so that a tenant arriving during another's flood "
        "waits for no start of the flood.",
    )

    # -- hardening and resources
    sandbox_memory: str = Field(
        default="1g", description="Memory limit per sandbox (docker syntax: 512m, 2g); no swap."
    )
    sandbox_cpus: float = Field(default=1.0, gt=0, description="CPUs per sandbox.")
    sandbox_pids: int = Field(
        default=512, ge=32, description="Process/thread limit per sandbox (fork bombs stop here)."
    )
    sandbox_tmp_size: str = Field(
        default="512m", description="Size of the /tmp tmpfs (within sandbox_memory)."
    )
    sandbox_inodes: int = Field(
        default=262_144,
        ge=1024,
        le=1 << 24,
        description="Files, directories and links that /workspace (tmpfs) and /tmp may each "
        "hold; past it creating one fails with 'No space left on device'. Each costs the "
        "kernel about 1 KiB of the sandbox's memory.",
    )
    sandbox_open_files: int = Field(
        default=4096, ge=64, le=1 << 20, description="Open files per process in a sandbox."
    )
    sandbox_max_file_size: str = Field(
        default="2g",
        description="Largest file a process in a sandbox may write (RLIMIT_FSIZE); writing "
        "past it fails with 'File too large'.",
    )
    sandbox_workspace: str = Field(
        default="tmpfs",
        description="'tmpfs': /workspace is a tmpfs of sandbox_workspace_size bytes and "
        "sandbox_inodes files, so writing past it fails with 'No space left on device'; it "
        "lives in memory, so the container's memory limit is sandbox_memory plus that size. "
        "'volume': an anonymous Docker volume on the engine's disk with NO size limit (one "
        "sandbox can fill the engine's disk).",
    )
    sandbox_workspace_size: str = Field(
        default="2g",
        description="Most bytes /workspace holds when sandbox_workspace is 'tmpfs' (its quota; "
        "added to the container's memory limit).",
    )
    sandbox_workspace_max_size: str = Field(
        default="8g",
        description="The largest /workspace quota a task may ask for (`workspace_mib`); a "
        "larger ask gets this much. Each is memory charged to the sandbox while it lives.",
    )
    sandbox_network: bool = Field(
        default=False,
        description="Egress for every sandbox: all join sandbox_network_name instead of having "
        "no network at all. Leave it off and let tasks opt in with `network_egress`.",
    )
    sandbox_network_name: str = Field(
        default="bridge",
        description="Docker network that sandboxes with egress join (a task's opt-in, or "
        "sandbox_network); 'host' is refused.",
    )
    allow_network_egress: bool = Field(
        default=False,
        description="Whether a task that opted in (`network_egress`) gets a sandbox with "
        "network; false (the default: the operator allows egress) runs its actions nowhere and "
        "tells the agent why.",
    )
    docker_runtime: str | None = Field(
        default=None,
        description="OCI runtime, e.g. 'runsc' for gVisor (registered in Docker with the "
        "runtime argument --network=none); empty uses the engine's default.",
    )
    docker_init: bool = Field(
        default=True, description="Run Docker's init as PID 1 (reaps zombies, forwards signals)."
    )
    sandbox_log_max_size: str = Field(
        default="1m", description="Cap of the container's json-file log (executor stderr)."
    )

    # -- execution
    action_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Hard timeout of a command or Python cell that sets none.",
    )
    no_output_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="A command with no new output for this long returns what it printed so "
        "far and keeps running (follow up with is_input); unset disables it.",
    )
    output_limit: int = Field(
        default=30_000,
        ge=100,
        description="Characters of output kept per action; the middle of longer output is cut.",
    )
    output_keep_bytes: int = Field(
        default=4 << 20,
        ge=0,
        le=256 << 20,
        description="A command's, cell's or file read's whole output, when longer than "
        "output_limit, is kept in the blob store up to this many bytes (the observation's "
        "content_ref; GET /v1/tasks/{id}/blobs/{sha256}); 0 keeps only the cut output.",
    )
    workers: int = Field(
        default=512,
        ge=1,
        description="Work orders one replica handles at once (different tasks). A running "
        "command only waits on its sandbox, so this is high; Docker calls are bounded by "
        "docker_threads and sandboxes by pool_max_total.",
    )
    dedup_ttl_s: int = Field(
        default=86_400,
        ge=60,
        description="How long an executed action's observation is kept to answer redeliveries.",
    )
    queue_preempt_after_s: float = Field(
        default=10.0,
        ge=0,
        description="While tasks wait for a seat, a sandbox whose task waits for a person or "
        "for a sub-task and ran nothing for this long is stopped (files kept) and its seat "
        "given to the queue, so waiting tasks (and sub-tasks a parent waits for) can never be "
        "shut out by tasks that are not running anything.",
    )
    sandbox_idle_stop_s: float | None = Field(
        default=600.0,
        gt=0,
        description="A task sandbox whose task waits for the user (input, confirmation, "
        "paused, or ERROR awaiting a resume) and that ran no action for this long is stopped to "
        "free its memory and CPU. Its /workspace is kept; it starts again on the task's next "
        "action, with a new shell and Python session (a tmpfs workspace is held meanwhile by a "
        "keeper container, its files still in memory). Unset keeps such sandboxes running.",
    )
    binding_ttl_s: int = Field(
        default=7 * 86_400,
        ge=60,
        description="Task-to-sandbox bindings in Redis expire after this long without use.",
    )

    # -- workspaces in and out, repositories (workspace_ops.py, retention.py, *checkout.py)
    workspace_retention_s: float = Field(
        default=900.0,
        ge=0,
        description="A task that ended (FINISHED, STOPPED, REJECTED) keeps its sandbox paused, "
        "files in /workspace kept (in memory for a tmpfs workspace), for this long: its "
        "workspace can be downloaded, and a message resuming the task finds its files. Then "
        "it is removed and the workspace routes answer 410. 0 removes it at once.",
    )
    workspace_retained_max: int = Field(
        default=50,
        ge=1,
        description="Most ended tasks whose sandbox the pool keeps (across its replicas): each "
        "is a paused container holding its processes' memory and, for a tmpfs workspace, its "
        "files. Beyond it the oldest kept one is removed before its retention ends (its "
        "workspace answers 410): hundreds of tasks ending in a burst must not leave hundreds "
        "of containers behind on the engine.",
    )
    workspace_max_extract_bytes: int = Field(
        default=1 << 30,
        ge=1,
        description="An upload into a workspace: at most this many bytes once extracted.",
    )
    workspace_max_files: int = Field(
        default=100_000, ge=1, description="An upload into a workspace: at most this many entries."
    )
    workspace_helper_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="Deadline of a diff or an uploaded tree's baseline (a helper container).",
    )
    repository_allowed_hosts: list[str] = Field(
        default=[],
        description="Host names (or addresses) a task's repository may name although the "
        'address policy refuses them (JSON list, e.g. ["git.internal"]): loopback, private '
        "and other internal addresses are refused otherwise. Same variable as the gateway's. "
        "Such a host is fetched as its name resolves, unchecked.",
    )
    repository_url_schemes: list[str] = Field(
        default=["https", "http", "git"],
        description="URL schemes a task's repository may use (JSON list). Same variable as "
        "the gateway's. file:// and ext:: are never allowed: a tenant must not read the "
        "runtime's host.",
    )
    repository_clone_timeout_s: float = Field(
        default=300.0, gt=0, description="Deadline of a repository's clone (and its checkout)."
    )
    repository_max_bytes: int = Field(
        default=1 << 30,
        ge=1 << 20,
        description="A repository's fetched objects (.git) may not pass this many bytes.",
    )
    instructions_max_bytes: int = Field(
        default=16_384,
        ge=0,
        description="Repository instructions (AGENTS.md, .openhands/microagents/repo.md) read "
        "from a workspace for the system prompt: at most this many bytes.",
    )

    @field_validator(
        "sandbox_memory",
        "sandbox_tmp_size",
        "sandbox_workspace_size",
        "sandbox_workspace_max_size",
        "sandbox_log_max_size",
        "sandbox_max_file_size",
    )
    @classmethod
    def _size(cls, value: str) -> str:
        if not SIZE.match(value):
            raise ValueError(f"{value!r} is not a size like 512m or 2g")
        return value.lower()

    @field_validator("sandbox_workspace")
    @classmethod
    def _workspace_kind(cls, value: str) -> str:
        if value not in {"volume", "tmpfs"}:
            raise ValueError(f"unknown workspace kind {value!r}; use volume or tmpfs")
        return value

    @field_validator("sandbox_network_name")
    @classmethod
    def _not_host(cls, value: str) -> str:
        if value in {"host", "none"} or value.startswith("container:"):
            raise ValueError(
                f"sandbox_network_name {value!r} is not allowed: use a bridge or user-defined "
                "network ('host' would share the host's network stack)"
            )
        return value

    @field_validator("repository_url_schemes")
    @classmethod
    def _schemes(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if v not in {"https", "http", "git", "ssh"}]
        if bad:
            raise ValueError(f"repository_url_schemes: {bad} not allowed (https, http, git, ssh)")
        return value

    @field_validator("docker_runtime")
    @classmethod
    def _runtime(cls, value: str | None) -> str | None:
        return value or None

    def replica(self) -> str:
        """This replica's name as a subject token and consumer name (runtime_replica, or the
        host's name)."""
        return replica_token(self.runtime_replica or socket.gethostname())

    @model_validator(mode="after")
    def _consistent(self) -> RuntimeSettings:
        if self.pool_min_idle > self.pool_max_total:
            raise ValueError(
                f"pool_min_idle ({self.pool_min_idle}) exceeds pool_max_total "
                f"({self.pool_max_total})"
            )
        if self.pool_max_idle < self.pool_min_idle:
            raise ValueError(
                f"pool_max_idle ({self.pool_max_idle}) is below pool_min_idle "
                f"({self.pool_min_idle})"
            )
        return self
