"""The pure diff: consecutive IMDS documents -> lifecycle transitions (table-driven)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sebridge.contract.events import Transition
from sebridge.forwarder.imds.diff import STARTED_HIDDEN_BY_GAP, diff, index, remember
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
        {"DocumentIncarnation": 1},
        {"DocumentIncarnation": 1, "Events": {}},
        {"DocumentIncarnation": 1, "Events": ["x"]},
        {"DocumentIncarnation": 1, "Events": [{"EventType": "Reboot", "EventStatus": "Scheduled"}]},
        {"DocumentIncarnation": 1, "Events": [ev(), ev(B, EventId=None)]},
        {"DocumentIncarnation": 1, "Events": [ev(), ev(B, EventId=" ")]},
        {"DocumentIncarnation": 1, "Events": [ev(), ev(B, EventId=42)]},
    ],
)
def test_structurally_invalid_documents_are_rejected_whole(body: object) -> None:
    """Without a usable EventId an event cannot be keyed: taking the rest would look like
    "that event vanished", so the whole document is refused (the poll fails and is retried)."""
    with pytest.raises(InvalidDocument):
        Document.from_imds(body)


def test_duplicate_event_id_in_one_document_counts_once() -> None:
    document = doc(1, ev(A.upper()), ev(A.lower(), status="Started"))
    assert [e.event_id for e in document.events] == [A.upper()]


# -- one event's odd fields never fail the document (issue 10, item 5) ------------------------

OUT_OF_RANGE_TIMES = [
    "9999-12-31T23:59:59-01:00",  # cannot be expressed in UTC
    "Fri, 31 Dec 9999 23:59:59 -0100",  # the same in RFC 1123
    "Mon, 11 Apr 20222222222222222222 22:26:58 GMT",  # a 20-digit year
    "20222222222222222222-04-11T22:26:58Z",
    "0000-01-01T00:00:00Z",
    "Mon, 99 Foo 2022 99:99:99 GMT",
    "9" * 5000,
]


@pytest.mark.parametrize("value", OUT_OF_RANGE_TIMES)
def test_an_out_of_range_not_before_is_kept_verbatim_and_parsed_to_null(value: str) -> None:
    document = doc(1, ev(A, NotBefore=value), ev(B))
    odd, fine = document.events
    assert odd.not_before is None and odd.raw["NotBefore"] == value
    assert fine.not_before is not None
    assert transitions(None, document) == [("Scheduled", A), ("Scheduled", B)]


@pytest.mark.parametrize(
    ("fields", "read_as"),
    [
        ({"EventType": 42}, {"event_type": ""}),
        ({"EventType": None}, {"event_type": ""}),
        ({"EventStatus": ["Started"]}, {"status": "", "is_started": False}),
        ({"EventStatus": None}, {"status": ""}),
        ({"Resources": "vm1"}, {"resources": ()}),
        ({"Resources": ["vm1", 7, None, "vm2"]}, {"resources": ("vm1", "vm2")}),
        # beyond a year (sebridge.times.MAX_SPAN_SECONDS): unreadable, kept verbatim
        ({"DurationInSeconds": 3_000_000_000}, {"duration_in_seconds": None}),
        ({"DurationInSeconds": 86_400}, {"duration_in_seconds": 86_400}),
        ({"DurationInSeconds": "9" * 5000}, {"duration_in_seconds": None}),
        ({"DurationInSeconds": 1e400}, {"duration_in_seconds": None}),
        ({"Description": {"x": 1}}, {"description": None}),
        ({"EventSource": 3}, {"event_source": None}),
    ],
)
def test_odd_field_values_are_tolerated_and_kept_verbatim(
    fields: dict[str, Any], read_as: dict[str, Any]
) -> None:
    document = doc(1, ev(A, **fields), ev(B))
    odd, fine = document.events
    for name, value in read_as.items():
        assert getattr(odd, name) == value, name
    for name, value in fields.items():
        assert odd.raw[name] == value  # verbatim, whatever it is
    assert fine.event_type == "Reboot" and fine.resources == ("vm1",)
    assert transitions(None, document) == [("Scheduled", A), ("Scheduled", B)]


def test_an_odd_value_changing_is_an_update_and_never_a_vanishing() -> None:
    before = doc(1, ev(A), ev(B))
    after = doc(2, ev(A, EventType=7, NotBefore="9999-12-31T23:59:59-01:00"), ev(B))
    assert transitions(before, after) == [("Updated", A)]


# -- vanished while Scheduled: Cancelled unless the observation gap could hide Started --------

NOT_BEFORE = datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)
JUST_UNDER = STARTED_HIDDEN_BY_GAP - timedelta(seconds=1)


@pytest.mark.parametrize(
    ("not_before_passed_by", "gap", "expected"),
    [
        # Watched without a gap: Started stays visible for minutes, so it was cancelled.
        (timedelta(seconds=5), timedelta(seconds=1), "Cancelled"),
        (timedelta(minutes=10), timedelta(seconds=1), "Cancelled"),
        (timedelta(seconds=5), JUST_UNDER, "Cancelled"),
        # A gap long enough to hide Started (a restart, a long IMDS outage): it ran unseen.
        (timedelta(seconds=5), STARTED_HIDDEN_BY_GAP, "Completed"),
        (timedelta(minutes=10), timedelta(hours=3), "Completed"),
        # NotBefore still ahead: it cannot have run, however long the gap.
        (-timedelta(seconds=5), timedelta(hours=3), "Cancelled"),
    ],
)
def test_vanished_while_scheduled_depends_on_the_observation_gap(
    not_before_passed_by: timedelta, gap: timedelta, expected: str
) -> None:
    now = NOT_BEFORE + not_before_passed_by
    known = index(doc(1, ev()).events)
    (change,) = diff(known, doc(2), now, last_seen=now - gap)
    assert change.transition.value == expected


def test_the_gap_threshold_is_shorter_than_started_lasts_and_longer_than_polling_makes() -> None:
    """The documented bounds (forwarder/imds/diff.py): longer than the longest gap one failed poll
    makes (a 10 s request deadline, then at most 5 s of backoff), shorter than a typical
    Started (5 to 10 minutes)."""
    from sebridge.forwarder.imds.client import READ_TIMEOUT
    from sebridge.forwarder.service import MAX_POLL_BACKOFF

    assert timedelta(seconds=READ_TIMEOUT + MAX_POLL_BACKOFF) < STARTED_HIDDEN_BY_GAP
    assert timedelta(minutes=5) / 5 >= STARTED_HIDDEN_BY_GAP


@pytest.mark.parametrize(
    "fields", [{"EventType": 42}, {"EventStatus": None}, {"Resources": "vm1"}, {"Resources": [1]}]
)
def test_a_single_event_read_on_its_own_is_strict_by_default(fields: dict[str, Any]) -> None:
    """An Event Grid notification is one event: its ingestion refuses what it cannot read, with
    a reason. Documents, the forwarder's state and a message's data (parse_message) tolerate,
    and name what they normalised (tests/unit/test_tolerant_reader.py)."""
    from sebridge.imds import ScheduledEvent

    with pytest.raises(InvalidDocument):
        ScheduledEvent.from_imds(ev(**fields))
    assert ScheduledEvent.from_imds(ev(**fields), strict=False).key == A.lower()


def _follow(*documents: Document) -> list[tuple[str, str]]:
    """Every transition over a sequence of documents, remembering between them as the
    forwarder and its local actions do."""
    known: dict[str, Any] = {}
    out: list[tuple[str, str]] = []
    for document in documents:
        out += [(c.transition.value, c.event.key) for c in diff(known, document)]
        known = remember(known, document.events)
    return out


def test_started_never_goes_back_so_it_is_reported_once() -> None:
    """Found by the state machine: Started, then the same event Scheduled again (IMDS never
    does it; a garbled or replayed document can), then Started. Remembered as Scheduled, the
    event was reported Started twice under one id (``<ref>:Started:1``)."""
    started, scheduled = ev(status="Started"), ev()
    assert _follow(doc(1, started), doc(2, scheduled), doc(3, started)) == [("Started", A)]
    assert _follow(doc(1, started), doc(2, scheduled), doc(3)) == [
        ("Started", A),
        ("Completed", A),
    ]
    assert _follow(doc(1, scheduled), doc(2, ev(NotBefore="Mon, 11 Apr 2022 23:00:00 GMT"))) == [
        ("Scheduled", A),
        ("Updated", A),
    ]


# The README's numbers, written out (not STARTED_HIDDEN_BY_GAP): a Scheduled event whose
# NotBefore has passed and that vanished after 29 s unseen was Cancelled, after 30 s Completed.
@pytest.mark.parametrize(
    ("gap_seconds", "expected"),
    [(1, "Cancelled"), (29, "Cancelled"), (30, "Completed"), (31, "Completed")],
)
def test_the_gap_that_hides_started_is_30_seconds(gap_seconds: int, expected: str) -> None:
    now = datetime(2022, 4, 11, 22, 27, 3, tzinfo=UTC)  # NotBefore (22:26:58) + 5 s
    known = index(doc(1, ev()).events)
    (change,) = diff(known, doc(2), now, last_seen=now - timedelta(seconds=gap_seconds))
    assert change.transition.value == expected


def test_at_exactly_not_before_the_event_may_have_run() -> None:
    """Azure starts an event at NotBefore: observed at that very second after a long gap, a
    vanished Scheduled event may have run unseen (Completed); a second earlier it cannot."""
    not_before = datetime(2022, 4, 11, 22, 26, 58, tzinfo=UTC)  # ev()'s NotBefore
    known = index(doc(1, ev()).events)
    for now, expected in [
        (not_before, "Completed"),
        (not_before - timedelta(seconds=1), "Cancelled"),
    ]:
        (change,) = diff(known, doc(2), now, last_seen=now - timedelta(hours=1))
        assert change.transition.value == expected, now
