"""The pure diff: consecutive IMDS documents -> lifecycle transitions (table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sebridge.contract.events import Transition
from sebridge.forwarder.diff import diff, index
from sebridge.imds import Document, InvalidDocument

A = "3f1c2c3e-5b7a-4c1d-9e8f-0a1b2c3d4e5f"
B = "9d8c7b6a-5f4e-4d3c-8b2a-1f0e9d8c7b6a"
C = "11111111-2222-4333-8444-555555555555"


def ev(event_id: str = A, status: str = "Scheduled", **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "EventId": event_id,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "EventStatus": status,
        "NotBefore": "" if status == "Started" else "Mon, 11 Apr 2022 22:26:58 GMT",
        "Description": "Host server is undergoing maintenance.",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not DROP}


DROP = object()


def doc(incarnation: int, *events: dict[str, Any]) -> Document:
    return Document.from_imds({"DocumentIncarnation": incarnation, "Events": list(events)})


def transitions(before: Document | None, after: Document) -> list[tuple[str, str]]:
    known = index(before.events) if before else {}
    return [(c.transition.value, c.event.key) for c in diff(known, after)]


CASES = [
    pytest.param(None, doc(1), [], id="empty-first-document"),
    pytest.param(None, doc(1, ev()), [("Scheduled", A)], id="new-scheduled"),
    pytest.param(
        None,
        doc(1, ev(status="Started")),
        [("Started", A)],
        id="hardware-failure-first-seen-started",
    ),
    pytest.param(
        doc(1, ev()), doc(2, ev(status="Started")), [("Started", A)], id="scheduled-to-started"
    ),
    pytest.param(
        doc(2, ev(status="Started")), doc(3), [("Completed", A)], id="vanished-after-started"
    ),
    pytest.param(doc(1, ev()), doc(2), [("Cancelled", A)], id="vanished-while-scheduled"),
    pytest.param(doc(1, ev()), doc(1, ev()), [], id="unchanged"),
    pytest.param(doc(1, ev()), doc(2, ev()), [], id="incarnation-bump-without-change"),
    pytest.param(
        doc(2, ev(status="Started")), doc(3, ev(status="Started")), [], id="started-stays-started"
    ),
    pytest.param(
        None,
        doc(5, ev(A), ev(B, status="Started", EventType="Freeze"), ev(C)),
        [("Scheduled", A), ("Started", B), ("Scheduled", C)],
        id="several-events-in-one-document",
    ),
    pytest.param(
        doc(5, ev(A), ev(B, status="Started"), ev(C)),
        doc(6, ev(A, status="Started")),
        [("Started", A), ("Completed", B), ("Cancelled", C)],
        id="several-transitions-at-once",
    ),
    pytest.param(
        doc(1, ev()),
        doc(2, ev(NotBefore="Mon, 11 Apr 2022 22:40:00 GMT")),
        [("Updated", A)],
        id="notbefore-moved",
    ),
    pytest.param(
        doc(1, ev()), doc(2, ev(Resources=["vm1", "vm2"])), [("Updated", A)], id="resources-grew"
    ),
    pytest.param(
        doc(1, ev()),
        doc(1, ev(DurationInSeconds=30)),
        [("Updated", A)],
        id="same-incarnation-different-content",
    ),
    pytest.param(doc(1, ev()), doc(2, ev(Description="other")), [("Updated", A)], id="description"),
    pytest.param(
        doc(40, ev(A), ev(B)),
        doc(1, ev(A), ev(C)),
        [("Scheduled", C), ("Cancelled", B)],
        id="incarnation-reset-rediffs-without-duplicates",
    ),
    pytest.param(
        doc(1, ev(NotBefore="Mon, 11 Apr 2022 22:26:58 GMT")),
        doc(2, ev(NotBefore="2022-04-11T22:26:58Z")),
        [],
        id="same-notbefore-in-rfc1123-and-iso8601",
    ),
    pytest.param(
        doc(1, ev(Resources=["VM1"])),
        doc(2, ev(Resources=["vm1"])),
        [],
        id="resource-names-are-case-insensitive",
    ),
    pytest.param(doc(1, ev(A.upper())), doc(2, ev(A.lower())), [], id="guid-case-is-one-event"),
    pytest.param(
        doc(1, ev(A.upper())),
        doc(2, ev(A.lower(), status="Started")),
        [("Started", A)],
        id="guid-case-across-transition",
    ),
    pytest.param(
        None,
        doc(1, ev(Description=DROP, EventSource=DROP, DurationInSeconds=DROP)),
        [("Scheduled", A)],
        id="optional-fields-missing",
    ),
    pytest.param(
        doc(1, ev(Description=DROP)),
        doc(2, ev(Description=DROP)),
        [],
        id="optional-fields-missing-stay-missing",
    ),
]


@pytest.mark.parametrize(("before", "after", "expected"), CASES)
def test_diff(before: Document | None, after: Document, expected: list[tuple[str, str]]) -> None:
    assert transitions(before, after) == expected


def test_updated_carries_the_changed_fields_only() -> None:
    before = doc(1, ev())
    after = doc(2, ev(NotBefore="Mon, 11 Apr 2022 22:40:00 GMT", Resources=["vm1", "vm2"]))
    (change,) = diff(index(before.events), after)
    assert change.transition is Transition.UPDATED
    assert change.changes == {
        "NotBefore": {
            "from": "Mon, 11 Apr 2022 22:26:58 GMT",
            "to": "Mon, 11 Apr 2022 22:40:00 GMT",
        },
        "Resources": {"from": ["vm1"], "to": ["vm1", "vm2"]},
    }


AFTER_NOT_BEFORE = datetime(2022, 4, 11, 22, 27, tzinfo=UTC)
BEFORE_NOT_BEFORE = datetime(2022, 4, 11, 22, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("fields", "now", "expected"),
    [
        ({}, BEFORE_NOT_BEFORE, "Cancelled"),
        ({}, AFTER_NOT_BEFORE, "Completed"),  # it ran while nobody looked (e.g. our reboot)
        ({}, None, "Cancelled"),
        ({"NotBefore": ""}, AFTER_NOT_BEFORE, "Cancelled"),  # no NotBefore: nothing to go by
        ({"NotBefore": "soon"}, AFTER_NOT_BEFORE, "Cancelled"),
    ],
)
def test_vanished_while_scheduled(fields: dict, now: datetime | None, expected: str) -> None:
    (change,) = diff(index(doc(1, ev(**fields)).events), doc(2), now)
    assert change.transition.value == expected


def test_completed_reports_the_last_known_event() -> None:
    started = doc(2, ev(status="Started", Resources=["vm1", "vm2"]))
    (change,) = diff(index(started.events), doc(3))
    assert change.transition is Transition.COMPLETED
    assert change.event.resources == ("vm1", "vm2")
    assert change.event.event_id == A


@pytest.mark.parametrize(
    ("value", "iso"),
    [
        ("Mon, 11 Apr 2022 22:26:58 GMT", "2022-04-11T22:26:58+00:00"),
        ("2022-04-11T22:26:58Z", "2022-04-11T22:26:58+00:00"),
        ("2022-04-11T22:26:58", "2022-04-11T22:26:58+00:00"),
        ("2022-04-12T00:26:58+02:00", "2022-04-11T22:26:58+00:00"),
        ("", None),
        ("next tuesday", None),
    ],
)
def test_not_before_formats(value: str, iso: str | None) -> None:
    (event,) = doc(1, ev(NotBefore=value)).events
    assert (event.not_before.isoformat() if event.not_before else None) == iso
    assert event.raw["NotBefore"] == value  # kept verbatim


def test_duration_minus_one_is_kept() -> None:
    (event,) = doc(1, ev(DurationInSeconds=-1)).events
    assert event.duration_in_seconds == -1


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"Events": []},
        {"DocumentIncarnation": "1", "Events": []},
        {"DocumentIncarnation": True, "Events": []},
        {"DocumentIncarnation": 1, "Events": {}},
        {"DocumentIncarnation": 1, "Events": ["x"]},
        {"DocumentIncarnation": 1, "Events": [{"EventType": "Reboot", "EventStatus": "Scheduled"}]},
        {"DocumentIncarnation": 1, "Events": [ev(Resources="vm1")]},
        {"DocumentIncarnation": 1, "Events": [ev(EventStatus=None)]},
    ],
)
def test_structurally_invalid_documents_are_rejected_whole(body: object) -> None:
    with pytest.raises(InvalidDocument):
        Document.from_imds(body)


def test_duplicate_event_id_in_one_document_counts_once() -> None:
    document = doc(1, ev(A.upper()), ev(A.lower(), status="Started"))
    assert [e.event_id for e in document.events] == [A.upper()]
