"""`deckhands logs` shows the egress proxy's account of a task's connections (issue 27): what
was reached and with which bytes, what was refused and why, and which bound secrets were added
(names only)."""

from __future__ import annotations

from rich.console import Console

from tools.cli.events import event_renderable


def _shown(event: dict[str, object]) -> str:
    console = Console(width=200, record=True, color_system=None)
    console.print(event_renderable(event))
    return console.export_text()


def test_a_connection_line_names_the_secrets_added_and_the_refusals() -> None:
    text = _shown(
        {
            "kind": "egress_activity",
            "seq": 7,
            "source": "environment",
            "connections": [
                {
                    "host": "api.github.com",
                    "port": 443,
                    "allowed": True,
                    "bytes_out": 812,
                    "bytes_in": 4096,
                    "secrets": ["GITHUB_TOKEN"],
                },
                {"host": "169.254.169.254", "port": 80, "allowed": False, "reason": "not_allowed"},
            ],
            "more": 2,
        }
    )
    assert "network:" in text
    assert "api.github.com:443 812 B out, 4096 B in (added GITHUB_TOKEN)" in text
    assert "169.254.169.254:80 refused (not_allowed)" in text
    assert "and 2 more" in text
