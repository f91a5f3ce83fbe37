"""At start-up: the Docker engine answers, knows the configured OCI runtime and has the image.

Blocking (docker-py): DockerSandboxes.check runs it on its threads.
"""

from __future__ import annotations

from typing import Any

from docker.errors import ImageNotFound

from .errors import SandboxStartError
from .settings import RuntimeSettings

__all__ = ["check_engine"]


def check_engine(api: Any, settings: RuntimeSettings) -> None:
    """SandboxStartError, with what to do, when the OCI runtime or the image is missing."""
    api.ping()
    runtime = settings.docker_runtime
    if runtime is not None:
        registered = sorted((api.info().get("Runtimes") or {}).keys())
        if runtime not in registered:
            # Otherwise every sandbox start fails, each with the engine's terse error.
            raise SandboxStartError(
                f"docker_runtime {runtime!r} is not registered with the Docker engine "
                f"(it has: {', '.join(registered) or 'none'}); for gVisor, "
                "deploy/sandbox/gvisor.sh (make setup) registers runsc"
            )
    try:
        api.inspect_image(settings.sandbox_image)
    except ImageNotFound:
        raise SandboxStartError(
            f"sandbox image {settings.sandbox_image!r} is missing; build it with "
            "deploy/sandbox/build.sh"
        ) from None
