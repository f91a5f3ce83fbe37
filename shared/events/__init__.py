"""Every event deckhands exchanges: one pydantic model per kind, one discriminated union."""

from .actions import *  # noqa: F403
from .actions import __all__ as _actions
from .agent_tools import *  # noqa: F403
from .agent_tools import __all__ as _agent_tools
from .base import *  # noqa: F403
from .base import __all__ as _base
from .checkpoints import *  # noqa: F403
from .checkpoints import __all__ as _checkpoints
from .egress import *  # noqa: F403
from .egress import __all__ as _egress
from .observations import *  # noqa: F403
from .observations import __all__ as _observations
from .reviewed import *  # noqa: F403
from .reviewed import __all__ as _reviewed
from .state import *  # noqa: F403
from .state import __all__ as _state
from .union import *  # noqa: F403
from .union import __all__ as _union

__all__ = [
    *_actions,
    *_agent_tools,
    *_base,
    *_checkpoints,
    *_egress,
    *_observations,
    *_reviewed,
    *_state,
    *_union,
]
