"""Message contract v1 and approval command contract v1: golden files, schemas, parsing."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import jsonschema
import pytest

from sebridge.contract import commands
from sebridge.contract.events import (
    ContractError,
    Transition,
    event_message,
    message_id_for,
    parse_message,
)
from tests.fixtures import golden

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def schema(name: str) -> dict[str, Any]:
    text = resources.files("sebridge.contract").joinpath("schemas", name).read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    jsonschema.Draft202012Validator.check_schema(loaded)
    return loaded


DATA_SCHEMA = schema("scheduled-event-data.v1.json")
COMMAND_SCHEMA = schema("approval-command.v1.json")
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.mark.parametrize("name", sorted(golden.build()))
def test_golden_file_is_what_the_contract_builds(name: str) -> None:
    on_disk = (golden.HERE / f"{name}.json").read_text("utf-8")
    assert on_disk == golden.render(golden.build()[name]), (
        "the wire format changed: if deliberate, run `python -m tests.fixtures.golden`"
    )


@pytest.mark.parametrize("name", sorted(golden.build()))
def test_golden_message_parses_back_and_fits_the_schema(name: str) -> None:
    envelope = golden.build()[name]
    jsonschema.validate(envelope.body["data"], DATA_SCHEMA, format_checker=FORMATS)
    message = parse_message(envelope.body_bytes())
    assert message.transition.value == envelope.subject == name.capitalize()
    assert message.observer == golden.OBSERVER
    assert envelope.application_properties["transition"] == envelope.subject
    assert envelope.body["type"] == f"Azure.VM.ScheduledEvent.{envelope.subject}"
    assert envelope.body["specversion"] == "1.0"
    if message.transition is Transition.HEARTBEAT:
        assert message.event is None and envelope.session_id == "web-1"
    else:
        assert message.event is not None
        assert message.event.key == golden.EVENT_ID.lower() == envelope.session_id
        assert envelope.body["subject"] == envelope.session_id
        # Prepared comes from the workflow that prepared; everything else from the observing VM.
        expected_source = (
            "urn:sebridge:function:lb-pools"
            if message.transition is Transition.PREPARED
            else golden.OBSERVER.resource_id
        )
        assert envelope.body["source"] == expected_source


def test_message_ids_are_deterministic_across_observers() -> None:
    event = golden._event(golden.SCHEDULED, 11)
    other_vm = replace(golden.OBSERVER, vm_name="web-2", resource_id="/x/web-2")
    first = event_message(Transition.SCHEDULED, event, golden.OBSERVER, 11, NOW)
    second = event_message(Transition.SCHEDULED, event, other_vm, 11, NOW + timedelta(seconds=3))
    assert first.message_id == second.message_id == f"{golden.EVENT_ID.lower()}:Scheduled"
    assert first.session_id == second.session_id


def test_updated_ids_differ_by_change() -> None:
    a = message_id_for("X", Transition.UPDATED, {"NotBefore": {"from": 1, "to": 2}})
    b = message_id_for("X", Transition.UPDATED, {"NotBefore": {"from": 2, "to": 3}})
    assert a != b and a.startswith("x:Updated:") and len(a.split(":")[-1]) == 8
    assert a == message_id_for("x", Transition.UPDATED, {"NotBefore": {"from": 1, "to": 2}})


def test_application_properties_carry_the_filter_fields() -> None:
    props = golden.build()["scheduled"].application_properties
    assert props == {
        "transition": "Scheduled",
        "eventType": "Reboot",
        "eventStatus": "Scheduled",
        "eventSource": "Platform",
        "durationInSeconds": -1,
        "vmName": "web-1",
        "resourceGroup": "rg-web",
        "subscriptionId": golden.SUBSCRIPTION,
        "resources": "web-1,web-2",
        "schemaVersion": 1,
    }


def test_dry_run_line_has_exactly_five_keys() -> None:
    line = golden.build()["started"].to_dict()
    assert set(line) == {"message_id", "session_id", "subject", "application_properties", "body"}


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"specversion": "1.0"}', "not a CloudEvent"),
        (
            json.dumps({**golden.build()["scheduled"].body, "type": "Other.Type"}).encode(),
            "unexpected CloudEvent type",
        ),
        (
            json.dumps(
                {**golden.build()["scheduled"].body, "type": "Azure.VM.ScheduledEvent.Nope"}
            ).encode(),
            "unknown transition",
        ),
        (
            json.dumps(
                {
                    **golden.build()["scheduled"].body,
                    "data": {**golden.build()["scheduled"].body["data"], "schemaVersion": 2},
                }
            ).encode(),
            "schemaVersion",
        ),
        (
            json.dumps(
                {
                    **golden.build()["scheduled"].body,
                    "data": {
                        k: v
                        for k, v in golden.build()["scheduled"].body["data"].items()
                        if k != "observer"
                    },
                }
            ).encode(),
            "observer",
        ),
    ],
)
def test_parse_message_says_what_is_wrong(body: bytes, complaint: str) -> None:
    with pytest.raises(ContractError, match=complaint):
        parse_message(body)


# -- approval commands ---------------------------------------------------------------------
GUID = "8b95c271-2b77-4243-ad1a-585faa9cd908"
VALID: dict[str, Any] = {
    "schemaVersion": 1,
    "command": "approve",
    "eventId": GUID.upper(),
    "requestedBy": "approval-gate",
    "reason": "policy",
    "expiresAt": "2026-11-22T02:00:00Z",
}


def test_valid_command_round_trips() -> None:
    command = commands.parse_command(json.dumps(VALID).encode(), NOW)
    assert command.event_id == GUID  # canonical lower case
    assert command.message_id == f"approve:{GUID}"
    assert command.expires_at == datetime(2026, 11, 22, 2, 0, tzinfo=UTC)
    again = commands.parse_command(command.body_bytes(), NOW)
    assert again == command
    jsonschema.validate(command.to_body(), COMMAND_SCHEMA, format_checker=FORMATS)


INVALID = [
    (b"{oops", commands.INVALID_JSON),
    (b"[1]", commands.INVALID_JSON),
    (b"\xff", commands.INVALID_JSON),
    (json.dumps({**VALID, "schemaVersion": 2}).encode(), commands.UNSUPPORTED_SCHEMA_VERSION),
    (json.dumps({**VALID, "schemaVersion": True}).encode(), commands.UNSUPPORTED_SCHEMA_VERSION),
    (json.dumps({**VALID, "command": "reboot"}).encode(), commands.UNKNOWN_COMMAND),
    (
        json.dumps({k: v for k, v in VALID.items() if k != "command"}).encode(),
        commands.UNKNOWN_COMMAND,
    ),
    (json.dumps({**VALID, "eventId": "not-a-guid"}).encode(), commands.INVALID_EVENT_ID),
    (json.dumps({**VALID, "eventId": 42}).encode(), commands.INVALID_EVENT_ID),
    (json.dumps({**VALID, "requestedBy": ""}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "requestedBy": "x" * 600}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "requestedBy": "a\nb"}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "reason": 5}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "expiresAt": "tomorrow"}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "expiresAt": "2026-11-22T02:00:00"}).encode(), commands.INVALID_FIELD),
    (json.dumps({**VALID, "expiresAt": "2026-11-22T00:59:59Z"}).encode(), commands.EXPIRED),
]


@pytest.mark.parametrize(("body", "reason"), INVALID)
def test_invalid_commands_name_their_reason(body: bytes, reason: str) -> None:
    with pytest.raises(commands.CommandError) as caught:
        commands.parse_command(body, NOW)
    assert caught.value.reason == reason
    assert caught.value.description


@pytest.mark.parametrize(("body", "reason"), INVALID)
def test_schema_rejects_what_the_parser_rejects(body: bytes, reason: str) -> None:
    """The shipped JSON Schema agrees with the parser (expiry needs a clock, so it is exempt)."""
    if reason == commands.EXPIRED:
        return
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return  # not JSON at all: nothing for a schema to judge
    validator = jsonschema.Draft202012Validator(COMMAND_SCHEMA, format_checker=FORMATS)
    assert not validator.is_valid(document), f"schema accepted a command rejected with {reason}"
