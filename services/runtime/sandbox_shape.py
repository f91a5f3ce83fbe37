"""What a task's sandbox is made with beyond the pool's defaults, chosen at its first action
and held for the task's life: a Docker network (the plain `network_egress`), a /workspace
quota of its own, or a network policy (issue 27: no network at all, only the egress proxy's
folder, egress_folders.py)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.egress_policy import EgressPolicy, SandboxEgress

from .settings import RuntimeSettings

__all__ = ["POOL_SHAPE", "SandboxShape", "shape_for"]


@dataclass(frozen=True)
class SandboxShape:
    network: str | None = None
    workspace_bytes: int | None = None
    egress: SandboxEgress | None = None

    def own(self, pool_network: str) -> bool:
        """Made for one task (never from, nor back to, the warm pool)."""
        return (
            (self.network is not None and self.network != pool_network)
            or self.workspace_bytes is not None
            or self.egress is not None
        )


POOL_SHAPE = SandboxShape()


def shape_for(
    settings: RuntimeSettings,
    task_id: str,
    *,
    tenant_id: str | None,
    network_egress: bool,
    network: EgressPolicy | None,
    workspace_mib: int | None,
) -> SandboxShape:
    """The shape of a task's sandbox, from its State or its order (the caller checks that the
    runtime allows what it asks for)."""
    egress = None
    if network is not None:
        egress = SandboxEgress(task_id=task_id, tenant_id=tenant_id, network=network)
    return SandboxShape(
        network=settings.sandbox_network_name if network_egress and egress is None else None,
        workspace_bytes=settings.task_workspace_bytes(workspace_mib),
        egress=egress,
    )
