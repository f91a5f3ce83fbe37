"""proto_schemas/ must match what tools/gen_schemas.py generates from the code right now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import gen_schemas

HINT = "proto_schemas/ is out of date: run `make schemas` (or `python -m tools.gen_schemas`)"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return gen_schemas.generate()


def test_committed_schemas_are_up_to_date(generated: dict[str, str]) -> None:
    problems = gen_schemas.check(generated)
    if problems:
        pytest.fail(HINT + "\n\n" + "\n".join(problems), pytrace=False)


def test_generation_is_deterministic(generated: dict[str, str]) -> None:
    assert gen_schemas.generate() == generated


def test_environment_does_not_leak_into_the_document(
    generated: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DECKHANDS_NATS_URL", "nats://leaked-host.example:4999")
    again = gen_schemas.generate()
    assert "leaked-host" not in again[gen_schemas.ASYNCAPI_FILE]
    assert again == generated


def test_event_schema_covers_every_event_kind(generated: dict[str, str]) -> None:
    from shared.events import ACTION_TYPES, ENVELOPE_TYPES, OBSERVATION_TYPES

    schema = json.loads(generated[gen_schemas.EVENTS_FILE])
    mapping = schema["discriminator"]["mapping"]
    assert schema["discriminator"]["propertyName"] == "kind"
    expected = {
        model.model_fields["kind"].default
        for model in (*ACTION_TYPES, *OBSERVATION_TYPES, *ENVELOPE_TYPES)
    }
    assert set(mapping) == expected


def test_commands_schema_defines_every_command(generated: dict[str, str]) -> None:
    import shared.commands

    schema = json.loads(generated[gen_schemas.COMMANDS_FILE])
    assert set(shared.commands.__all__) <= set(schema["$defs"])


def test_asyncapi_keeps_every_channel_of_every_broker(generated: dict[str, str]) -> None:
    from faststream.specification import AsyncAPI

    document = json.loads(generated[gen_schemas.ASYNCAPI_FILE])
    assert document["asyncapi"].startswith("3.")
    brokers = gen_schemas.discover_brokers()
    assert "security" in brokers
    for service, broker in brokers.items():
        alone = AsyncAPI(broker, title=service).to_specification().to_jsonable()
        missing = set(alone["channels"]) - set(document["channels"])
        assert not missing, f"{service}'s channels {sorted(missing)} are not in asyncapi.json"


def test_check_reports_a_stale_file_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gen_schemas.main(["--out", str(tmp_path)]) == 0
    assert gen_schemas.main(["--check", "--out", str(tmp_path)]) == 0

    events = tmp_path / gen_schemas.EVENTS_FILE
    events.write_text(events.read_text().replace('"kind"', '"kynd"', 1))
    capsys.readouterr()
    assert gen_schemas.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "events.schema.json is out of date" in err
    assert '-    "propertyName": "kynd"' in err or "kynd" in err
    assert "make schemas" in err
