"""The egress proxy's settings: a folder whose socket paths would not fit stops start-up with
one clear line, not a sandbox left with no way out."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.egress.settings import EgressSettings


def test_a_folder_too_deep_for_unix_socket_paths_is_refused() -> None:
    with pytest.raises(ValidationError, match="over the 107 a unix socket may have"):
        EgressSettings(dir="/tmp/" + "x" * 90, replica="egress-0")
    assert EgressSettings(dir="/var/run/deckhands-egress", replica="egress-0").dir
