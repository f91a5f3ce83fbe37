"""Where the sandboxes' egress folders are (issue 27), a part of RuntimeSettings (settings.py)."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from .egress_folders import CaCertPath

__all__ = ["EgressFolderSettings"]


class EgressFolderSettings(BaseModel):
    egress_dir: str | None = Field(
        default=None,
        description="Folder shared with the egress proxy (its DECKHANDS_EGRESS_DIR): a "
        "sandbox whose task has a network policy gets a folder here, mounted read-only, as its "
        "only way out. Unset (and no egress_engine_dir): such tasks' actions are refused with "
        "the reason.",
    )
    egress_engine_dir: str | None = Field(
        default=None,
        description="Instead of egress_dir, for a runtime that shares no folder with its Docker "
        "engine (the gVisor node pool): the egress proxy's folder on the engine's host, written "
        "through a helper container of the sandbox image that mounts it.",
    )
    egress_folder_owner: int = Field(
        default=10001,
        ge=0,
        description="With egress_engine_dir: the uid (and gid) of the egress proxy on the "
        "engine's host, which gets each sandbox's folder to listen in.",
    )
    egress_ca_cert: CaCertPath = Field(
        default=None,
        description="The deployment's egress CA certificate (PEM, no key), which sandboxes "
        "with a network policy trust: the proxy adds secrets bound to a host with it.",
    )

    @property
    def egress_folders_kept(self) -> bool:
        """Whether this runtime has an egress proxy to give a task with a policy."""
        return bool(self.egress_dir or self.egress_engine_dir)

    @model_validator(mode="after")
    def _one_egress_folder(self) -> EgressFolderSettings:
        if self.egress_dir and self.egress_engine_dir:
            raise ValueError(
                "egress_dir and egress_engine_dir are both set: the first is a folder this "
                "runtime shares with its engine, the second one only the engine has; set one"
            )
        if self.egress_engine_dir and not self.egress_engine_dir.startswith("/"):
            raise ValueError(f"egress_engine_dir {self.egress_engine_dir!r} is not absolute")
        return self
