"""The egress proxy's settings: a folder whose socket paths would not fit stops start-up with
one clear line, not a sandbox left with no way out."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from services.egress.settings import EgressSettings
from tools.egress_ca import new_ca


def test_a_folder_too_deep_for_unix_socket_paths_is_refused() -> None:
    with pytest.raises(ValidationError, match="over the 107 a unix socket may have"):
        EgressSettings(dir="/tmp/" + "x" * 90, replica="egress-0")
    assert EgressSettings(dir="/var/run/deckhands-egress", replica="egress-0").dir


def test_ca_files_must_exist_and_an_empty_one_is_none(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"DECKHANDS_EGRESS_CA_FILE names .* not a file"):
        EgressSettings(dir="/var/run/e", ca_file=str(tmp_path / "missing.pem"))
    empty = tmp_path / "empty.pem"
    empty.write_bytes(b"")
    assert EgressSettings(dir="/var/run/e", ca_file=str(empty)).ca_file == ""
    both, _ = new_ca()
    (tmp_path / "ca.pem").write_bytes(both)
    assert EgressSettings(dir="/var/run/e", ca_file=str(tmp_path / "ca.pem")).ca_file
