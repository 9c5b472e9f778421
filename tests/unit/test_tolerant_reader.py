"""The one tolerant reader of the contract (issue 22, items 3 and 14): documents and messages.

An odd field is normalised or dropped and named in ``warnings``; the event itself is never
dropped. Only what makes a document or a message unusable raises (InvalidDocument,
ContractError). The property tests put arbitrary JSON values into every field of a document's
event and of a message body.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sebridge.contract.events import ContractError, Transition, event_message, parse_message
from sebridge.forwarder.observability.health import OddValueLog
from sebridge.imds import Document, InvalidDocument, ScheduledEvent
from tests.fixtures import golden
from tests.support.budget import examples

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
A = "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f"
EVENT_FIELDS = (
    "EventType",
    "ResourceType",
    "Resources",
    "EventStatus",
    "NotBefore",
    "Description",
    "EventSource",
    "DurationInSeconds",
)


def imds_event(**fields: Any) -> dict[str, Any]:
    return {
        "EventId": A,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["web-1"],
        "EventStatus": "Scheduled",
        "NotBefore": "Sun, 22 Nov 2026 01:20:00 GMT",
        "Description": "Host maintenance",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    } | fields


def scheduled_body(**data: Any) -> dict[str, Any]:
    body = golden.build()["scheduled"].body
    return {**body, "data": {**body["data"], **data}}


# -- the examples of the issue ------------------------------------------------------------


def test_a_non_string_resource_is_dropped_and_named_the_rest_is_read() -> None:
    message = parse_message(json.dumps(scheduled_body(Resources=["web-1", 5])))
    assert message.event is not None and message.event.resources == ("web-1",)
    assert message.warnings == ("data.Resources[1]: 5 is not a string: dropped",)
    assert message.data["Resources"] == ["web-1", 5]  # data stays verbatim (the seal covers it)


def test_a_non_string_status_reads_as_empty_and_is_named() -> None:
    message = parse_message(json.dumps(scheduled_body(EventStatus=1)))
    assert message.event is not None and message.event.status == ""
    assert not message.event.is_started
    assert message.warnings == ('data.EventStatus: 1 is not a string: read as ""',)


def test_a_well_formed_message_has_no_warnings() -> None:
    for name, envelope in golden.build().items():
        assert parse_message(envelope.body_bytes()).warnings == (), name


def test_odd_optional_attributes_and_observer_fields_are_named_not_fatal() -> None:
    body = scheduled_body(
        documentIncarnation="7",
        observer={**golden.OBSERVER.to_data(), "vmId": 5, "zone": None},
        changes=[1],
    )
    body["time"] = "yesterday"
    body["subject"] = 42
    message = parse_message(json.dumps(body))
    assert message.time is None and message.incarnation is None
    assert message.observer.vm_id == "" and message.observer.vm_name == golden.OBSERVER.vm_name
    assert set(message.warnings) == {
        "time 'yesterday' is not an RFC 3339 timestamp: dropped",
        "attribute 'subject' is not a string: dropped",
        'data.observer.vmId: 5 is not a string: read as ""',
        'data.documentIncarnation: "7" is not an integer: read as null',
        "data.changes: [1] is not an object: ignored",
    }


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"EventId": 5}, "no EventId"),
        ({"EventId": " "}, "no EventId"),
        ({"observer": {"vmId": "x"}}, "observer.vmName is missing"),
        ({"observer": {"vmName": 7}}, "observer.vmName is missing"),
        ({"schemaVersion": "1"}, "schemaVersion"),
    ],
)
def test_what_makes_a_message_unusable_still_raises(change: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ContractError, match=complaint):
        parse_message(json.dumps(scheduled_body(**change)))


def test_a_document_incarnation_that_is_not_an_integer_hides_no_event() -> None:
    for odd in ("7", 7.5, True, None, [1], {"n": 1}):
        document = Document.from_imds({"DocumentIncarnation": odd, "Events": [imds_event()]})
        assert document.incarnation is None
        assert [e.key for e in document.events] == [A]
        assert len(document.warnings) == 1 and "DocumentIncarnation" in document.warnings[0]
    missing = Document.from_imds({"Events": [imds_event()]})
    assert missing.incarnation is None and missing.warnings == (
        "DocumentIncarnation: missing: read as null",
    )


def test_a_document_event_reports_each_normalisation() -> None:
    (event,) = Document.from_imds(
        {
            "DocumentIncarnation": 3,
            "Events": [
                imds_event(
                    Resources=["web-1", 5, None],
                    NotBefore="someday",
                    DurationInSeconds="long",
                    EventType=["Reboot"],
                    Description={"text": "x"},
                )
            ],
        }
    ).events
    assert event.resources == ("web-1",) and event.event_type == "" and event.description is None
    assert event.warnings == (
        'EventType: ["Reboot"] is not a string: read as ""',
        "Resources[1]: 5 is not a string: dropped",
        "Resources[2]: null is not a string: dropped",
        'NotBefore: "someday" is not a time: read as null',
        'Description: {"text": "x"} is not a string: dropped',
        'DurationInSeconds: "long" is not a whole number: read as null',
    )


def test_warnings_are_bounded_and_quote_values_short_and_escaped() -> None:
    (event,) = Document.from_imds(
        {"DocumentIncarnation": 1, "Events": [imds_event(Resources=[1] * 10_000)]}
    ).events
    assert len(event.warnings) == 21 and event.warnings[-1] == "...: 9980 more odd value(s)"
    (event,) = Document.from_imds(
        {"DocumentIncarnation": 1, "Events": [imds_event(EventType={"x": "\x1b[31m" + "y" * 999})]}
    ).events
    (line,) = event.warnings
    assert "\x1b" not in line and len(line) < 120


def test_the_forwarder_says_each_odd_value_once_per_event_and_field(
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = OddValueLog(logging.getLogger("test.odd"))
    one = Document.from_imds({"DocumentIncarnation": "x", "Events": [imds_event(EventStatus=1)]})
    caplog.set_level(logging.WARNING, "test.odd")
    assert odd.document(one) == 2
    assert odd.document(one) == 0  # the next polls: nothing again
    two = Document.from_imds(
        {"DocumentIncarnation": "x", "Events": [imds_event(EventStatus=1, Resources=[5])]}
    )
    assert odd.document(two) == 1  # a new odd field of the same event
    assert odd.document(Document.from_imds({"DocumentIncarnation": 1, "Events": []})) == 0
    assert odd.document(one) == 2  # gone and back: said again
    assert [r.getMessage().split(": ", 2)[-1] for r in caplog.records][:3] == [
        'DocumentIncarnation: "x" is not an integer: read as null',
        'EventStatus: 1 is not a string: read as ""',
        "Resources[0]: 5 is not a string: dropped",
    ]


# -- properties: any JSON value in any field -------------------------------------------------

json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=30),
        st.sampled_from(["", " ", "Started", "Scheduled", "\ud800", "9999-12-31T23:59:59-01:00"]),
    ),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
PROPERTY = settings(
    max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@pytest.mark.slow  # about 8 s or more: make check leaves it to make test
@PROPERTY
@given(
    values=st.dictionaries(st.sampled_from(EVENT_FIELDS), json_values, max_size=len(EVENT_FIELDS)),
    removed=st.sets(st.sampled_from(EVENT_FIELDS)),
    incarnation=json_values,
)
def test_any_value_in_any_field_of_a_document_keeps_the_event(
    values: dict[str, Any], removed: set[str], incarnation: Any
) -> None:
    raw = {k: v for k, v in (imds_event() | values).items() if k not in removed}
    other = imds_event(EventId="11111111-2222-4333-8444-555555555555")
    document = Document.from_imds({"DocumentIncarnation": incarnation, "Events": [raw, other]})
    assert [e.key for e in document.events] == [A, other["EventId"]]
    event = document.events[0]
    assert event.raw == {k: v for k, v in raw.items()}  # verbatim
    assert all(isinstance(r, str) for r in event.resources)
    for name in EVENT_FIELDS:  # a field that had to be normalised is named
        if name in values and name not in removed and _normalised(event, name, values[name]):
            assert any(w.startswith(name) for w in event.warnings), (name, event.warnings)
    # ...and the event goes on into a message that reads back with the same event.
    envelope = event_message(Transition.SCHEDULED, event, golden.OBSERVER, None, NOW)
    message = parse_message(envelope.body_bytes())
    assert message.event == event and message.event.key == A
    assert sorted(message.warnings) == sorted(f"data.{w}" for w in event.warnings)


def _normalised(event: ScheduledEvent, name: str, value: Any) -> bool:
    if name in ("EventType", "EventStatus"):
        return not isinstance(value, str)
    if name == "Resources":
        return not isinstance(value, list) or not all(isinstance(r, str) for r in value)
    if name in ("Description", "EventSource", "ResourceType"):
        return value is not None and not isinstance(value, str)
    if name == "DurationInSeconds":
        return value is not None and event.duration_in_seconds is None
    if name == "NotBefore":
        return (
            event.not_before is None
            and value not in (None, "")
            and not (isinstance(value, str) and not value.strip())
        )
    return False


MESSAGE_FIELDS = (
    *EVENT_FIELDS,
    "EventId",
    "schemaVersion",
    "documentIncarnation",
    "notBefore",
    "observer",
    "changes",
    "approval",
)


@pytest.mark.slow  # about 8 s or more: make check leaves it to make test
@PROPERTY
@given(
    transition=st.sampled_from(sorted(golden.build())),
    data=st.dictionaries(st.sampled_from(MESSAGE_FIELDS), json_values, max_size=5),
    observer=st.dictionaries(
        st.sampled_from(["vmName", "vmId", "resourceId", "zone", "vmScaleSetName"]),
        json_values,
        max_size=3,
    ),
    attributes=st.dictionaries(
        st.sampled_from(["specversion", "id", "source", "type", "subject", "time", "dataschema"]),
        json_values,
        max_size=2,
    ),
)
def test_any_value_in_any_field_of_a_message_is_read_or_refused_with_a_reason(
    transition: str, data: dict[str, Any], observer: dict[str, Any], attributes: dict[str, Any]
) -> None:
    body = golden.build()[transition].body
    new_data = {**body["data"], **data}
    if isinstance(new_data.get("observer"), dict):
        new_data["observer"] = {**new_data["observer"], **observer}
    mangled = {**body, **attributes, "data": new_data}
    try:
        message = parse_message(json.dumps(mangled))
    except ContractError:
        # Refused only for what makes a message unusable.
        vm_name = (
            new_data["observer"].get("vmName")
            if isinstance(new_data.get("observer"), dict)
            else None
        )
        event_id = new_data.get("EventId")
        assert (
            set(attributes) & {"specversion", "id", "source", "type"}
            or new_data.get("schemaVersion") != 1
            or isinstance(new_data.get("schemaVersion"), bool)
            or not isinstance(vm_name, str)
            or not vm_name
            or (
                transition != "heartbeat"
                and (not isinstance(event_id, str) or not event_id.strip())
            )
        ), mangled
        return
    if transition != "heartbeat":
        assert (
            message.event is not None and message.event.key == new_data["EventId"].strip().lower()
        )
    for line in message.warnings:
        assert isinstance(line, str) and line


def test_a_document_without_events_or_with_an_unkeyable_event_is_refused_whole() -> None:
    for body in ({"DocumentIncarnation": 1}, {"Events": [{"EventType": "Reboot"}]}, []):
        with pytest.raises(InvalidDocument):
            Document.from_imds(body)
