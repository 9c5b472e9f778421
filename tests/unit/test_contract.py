"""Message contract v1 and approval command contract v1: golden files, schemas, parsing."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from importlib import resources
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sebridge.contract import commands
from sebridge.contract.events import (
    ContractError,
    Observer,
    Transition,
    event_message,
    observed_by,
    parse_message,
    with_observer,
)
from tests.fixtures import golden
from tests.support.budget import examples

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
            if message.transition in (Transition.PREPARED, Transition.HELD)
            else golden.OBSERVER.resource_id
        )
        assert envelope.body["source"] == expected_source


def test_message_ids_are_deterministic_across_observers() -> None:
    event = golden._event(golden.SCHEDULED, 11)
    other_vm = replace(golden.OBSERVER, vm_name="web-2", resource_id="/x/web-2")
    first = event_message(Transition.SCHEDULED, event, golden.OBSERVER, 11, NOW)
    second = event_message(Transition.SCHEDULED, event, other_vm, 11, NOW + timedelta(seconds=3))
    assert first.message_id == second.message_id == f"{golden.EVENT_ID.lower()}:Scheduled:1"
    assert first.session_id == second.session_id


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
        # One trace per event (README "Message contract v1"): optional for consumers.
        "traceparent": "00-21c4f74798af482d41e76a8393873ccd-f3a7c7575422b473-01",
        "Diagnostic-Id": "00-21c4f74798af482d41e76a8393873ccd-f3a7c7575422b473-01",
    }


@pytest.mark.parametrize("name", sorted(golden.build()))
def test_a_message_built_under_the_host_name_is_rebound_to_the_vm_whole(name: str) -> None:
    """Issue 22 item 13: what the forwarder built before it knew the VM's identity is sent
    with it: the same message as the VM itself would have built (the golden one), observer,
    filter properties and source, with the id and session of the original."""
    host = Observer(vm_name="web-1-host", resource_group="stale-rg")
    identified = golden.build()[name]
    if not observed_by(identified, golden.OBSERVER):
        pytest.skip("not the VM's own message (a workflow's, or another observer's)")
    under_host = with_observer(identified, host)
    assert observed_by(under_host, host) and under_host.application_properties["vmName"] == (
        "web-1-host"
    )
    rebound = with_observer(under_host, golden.OBSERVER)
    if identified.subject == "Heartbeat":
        assert rebound.session_id == under_host.session_id  # a Heartbeat's is its VM: rebuilt
        return
    assert rebound.message_id == identified.message_id
    assert rebound.session_id == identified.session_id
    assert rebound.application_properties == identified.application_properties
    assert rebound.body == identified.body
    parse_message(rebound.body_bytes())


def test_rebinding_keeps_a_source_that_was_not_the_observers() -> None:
    prepared = golden.build()["prepared"]
    rebound = with_observer(prepared, Observer(vm_name="other", resource_id="/x/other"))
    assert rebound.body["source"] == prepared.body["source"]  # the workflow's URN
    assert rebound.body["data"]["observer"]["vmName"] == "other"


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


# -- the command parser and the command schema accept exactly the same bodies ---------------
#
# "Accepts" for the parser: returns a command, or rejects it only as expired (the schema has
# no clock). The schema is checked with and without format assertion: its patterns alone must
# carry every rule, since format checks are optional in JSON Schema 2020-12 (and
# jsonschema checks date-time only when rfc3339-validator happens to be installed).

VALIDATORS = {
    "with formats": jsonschema.Draft202012Validator(COMMAND_SCHEMA, format_checker=FORMATS),
    "patterns only": jsonschema.Draft202012Validator(COMMAND_SCHEMA),
}


def parser_accepts(document: object) -> bool:
    try:
        commands.parse_command(json.dumps(document).encode(), NOW)
    except commands.CommandError as exc:
        return exc.reason == commands.EXPIRED
    return True


def assert_agree(document: object) -> None:
    parsed = parser_accepts(document)
    for name, validator in VALIDATORS.items():
        assert validator.is_valid(document) == parsed, (
            f"{name}: schema {'accepts' if validator.is_valid(document) else 'rejects'} "
            f"what the parser {'accepts' if parsed else 'rejects'}: {document!r}"
        )


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in VALID.items() if k != key}


# (field, value, accepted): each replaces one field of VALID.
TRICKY: list[tuple[str, object, bool]] = [
    ("eventId", GUID, True),
    ("eventId", GUID.upper(), True),
    ("eventId", "8B95c271-2b77-4243-AD1A-585faa9cd908", True),
    ("eventId", "{" + GUID + "}", False),
    ("eventId", "urn:uuid:" + GUID, False),
    ("eventId", GUID.replace("-", ""), False),
    ("eventId", " " + GUID, False),
    ("eventId", GUID + "\n", False),
    ("eventId", GUID + "-", False),
    ("eventId", GUID.replace("8b95", "8b9g"), False),
    ("eventId", GUID.replace("2b77", "2_77"), False),
    ("eventId", GUID.replace("4243", "\u0664243"), False),  # an Arabic-Indic digit
    ("eventId", GUID[:8] + "-" + GUID[9:13] + GUID[14:], False),
    ("eventId", None, False),
    ("expiresAt", "2026-11-22T02:00:00Z", True),
    ("expiresAt", "2026-11-22T02:00:00.5Z", True),
    ("expiresAt", "2026-11-22T02:00:00.123456789Z", True),  # finer than microseconds
    ("expiresAt", "2026-11-22T03:00:00+01:00", True),
    ("expiresAt", "2026-11-21T20:00:00-06:30", True),
    ("expiresAt", "2026-11-22T02:00:00-00:00", True),
    ("expiresAt", "2026-11-22T02:00:00+23:59", True),
    ("expiresAt", "2028-02-29T00:00:00Z", True),  # a leap year
    ("expiresAt", "2400-02-29T00:00:00Z", True),
    ("expiresAt", "9999-12-31T23:59:59-01:00", True),  # past year 9999 in UTC: far future
    ("expiresAt", "2020-01-01T00:00:00Z", True),  # expired: valid, and judged by the clock
    ("expiresAt", "0001-01-01T00:30:00+01:00", True),  # before year 1 in UTC: expired
    ("expiresAt", "2026-11-22T02:00Z", False),  # no seconds (fromisoformat takes it)
    ("expiresAt", "20261122T020000Z", False),  # basic format (fromisoformat takes it)
    ("expiresAt", "2026-11-22T02:00:00", False),  # no offset
    ("expiresAt", "2026-11-22 02:00:00Z", False),
    ("expiresAt", "2026-11-22t02:00:00z", False),
    ("expiresAt", "2026-11-22T02:00:00+0100", False),
    ("expiresAt", "2026-11-22T02:00:00+01", False),
    ("expiresAt", "2026-11-22T02:00:00,5Z", False),
    ("expiresAt", "2026-11-22T02:00:00.Z", False),
    ("expiresAt", "2026-11-22T02:00:00Z\n", False),
    ("expiresAt", " 2026-11-22T02:00:00Z", False),
    ("expiresAt", "2026-11-22T24:00:00Z", False),
    ("expiresAt", "2026-12-31T23:59:60Z", False),  # leap second
    ("expiresAt", "2026-02-29T00:00:00Z", False),
    ("expiresAt", "2100-02-29T00:00:00Z", False),
    ("expiresAt", "2026-04-31T00:00:00Z", False),
    ("expiresAt", "2026-13-01T00:00:00Z", False),
    ("expiresAt", "2026-00-10T00:00:00Z", False),
    ("expiresAt", "0000-01-01T00:00:00Z", False),
    ("expiresAt", "2026-11-22T02:00:00+24:00", False),
    ("expiresAt", "2026-11-22T02:00:00+01:60", False),
    ("expiresAt", "\uff12026-11-22T02:00:00Z", False),  # a full-width digit
    ("expiresAt", "+12026-11-22T02:00:00Z", False),
    ("expiresAt", "2026-W47-7T02:00:00Z", False),
    ("expiresAt", 1_795_000_000, False),
    ("requestedBy", "\t ops", True),
    ("requestedBy", "ops\x7f", True),
    ("requestedBy", "\xa0ops", True),
    ("requestedBy", "x" * 512, True),
    ("requestedBy", "x" * 513, False),
    ("requestedBy", " \t ", False),
    ("requestedBy", "\x85", False),  # NEL: whitespace to Python
    ("requestedBy", "ops\n", False),
    ("requestedBy", "o\x00ps", False),
    ("reason", "", True),
    ("reason", "\tindented", True),
    ("reason", "line\n", False),
    ("reason", None, False),
    ("reason", "x" * 513, False),
    ("schemaVersion", 1.0, True),
    ("schemaVersion", True, False),
    ("schemaVersion", "1", False),
    ("command", "Approve", False),
]


@pytest.mark.parametrize(("field", "value", "accepted"), TRICKY)
def test_parser_and_schema_agree_on_tricky_fields(
    field: str, value: object, accepted: bool
) -> None:
    document = {**VALID, field: value}
    assert parser_accepts(document) is accepted
    assert_agree(document)


@pytest.mark.parametrize(
    "document",
    [
        without("reason"),
        without("requestedBy"),
        without("expiresAt"),
        without("eventId"),
        {**VALID, "extra": {"anything": [1, 2]}},
        [VALID],
        "approve",
        None,
    ],
    ids=[
        "no-reason",
        "no-requestedBy",
        "no-expiresAt",
        "no-eventId",
        "extra-key",
        "list",
        "string",
        "null",
    ],
)
def test_parser_and_schema_agree_on_tricky_shapes(document: object) -> None:
    assert_agree(document)


_digits = st.integers
date_times = st.one_of(
    st.builds(
        lambda y, mo, d, sep, h, mi, s, frac, zone, pad: (
            f"{pad[0]}{y:04d}-{mo:02d}-{d:02d}{sep}{h:02d}:{mi:02d}:{s:02d}{frac}{zone}{pad[1]}"
        ),
        _digits(0, 9999),
        _digits(0, 13),
        _digits(0, 32),
        st.sampled_from(["T", "T", "T", "t", " "]),
        _digits(0, 25),
        _digits(0, 61),
        _digits(0, 61),
        st.one_of(st.just(""), st.from_regex(r"\A\.[0-9]{1,12}\Z"), st.sampled_from([".", ","])),
        st.one_of(
            st.sampled_from(["Z", "Z", "z", "", "+0100", "+01"]),
            st.builds(
                lambda sign, h, m: f"{sign}{h:02d}:{m:02d}",
                st.sampled_from("+-"),
                _digits(0, 25),
                _digits(0, 61),
            ),
        ),
        st.sampled_from([("", ""), ("", ""), ("", ""), (" ", ""), ("", "\n"), ("", " ")]),
    ),
    st.text(max_size=40),
)
event_ids = st.one_of(
    st.builds(
        lambda u, form: form(str(u)),
        st.uuids(),
        st.sampled_from(
            [
                str,
                str.upper,
                lambda g: "{" + g + "}",
                lambda g: "urn:uuid:" + g,
                lambda g: g.replace("-", ""),
                lambda g: g + "\n",
                lambda g: g[:-1],
            ]
        ),
    ),
    st.text(alphabet="0123456789abcdefABCDEF-{}_ g\n", max_size=40),
)
texts = st.one_of(st.text(max_size=520), st.none(), st.integers())


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.builds(lambda v: {**VALID, "expiresAt": v}, date_times),
        st.builds(lambda v: {**VALID, "eventId": v}, event_ids),
        st.builds(lambda v: {**VALID, "requestedBy": v}, texts),
        st.builds(lambda v: {**VALID, "reason": v}, texts),
    )
)
def test_parser_and_schema_agree_on_generated_bodies(document: dict[str, Any]) -> None:
    assert_agree(document)
