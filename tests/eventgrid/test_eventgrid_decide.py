"""Notifications -> transitions: the rules, the forwarder's ids, duplicates and reordering."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from emulators.imds.testing import scenario_names
from functions.eventgrid_ingest.core import (
    EventRecord,
    Ingestor,
    Verdict,
    decide,
)
from functions.eventgrid_ingest.notification import Notification, parse_notification, raw_from_json
from sebridge.contract.events import Transition, parse_message
from sebridge.lifecycle import content_digest, event_ref
from tests.eventgrid.support import (
    EVENT_ID,
    T0,
    FixedClock,
    MemoryStore,
    Publisher,
    forwarder_ids,
    note,
    platform_notifications,
    scenario_documents,
)
from tests.support.budget import examples
from tests.unit.test_contract import DATA_SCHEMA, FORMATS

REF = event_ref(EVENT_ID)


def run(*notes: Notification) -> tuple[list[str], list[Verdict]]:
    """Feed notifications through decide() with the record carried along."""
    record: EventRecord | None = None
    ids, verdicts = [], []
    for n in notes:
        decision = decide(record, n)
        verdicts.append(decision.verdict)
        if decision.verdict is Verdict.APPLIED:
            record = decision.record
            if decision.message_id:
                ids.append(decision.message_id)
    return ids, verdicts


# -- one notification per status --------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "transition"),
    [
        ("Scheduled", "Scheduled"),
        ("Started", "Started"),
        ("Completed", "Completed"),
        ("Canceled", "Cancelled"),
    ],
)
def test_each_status_first_seen(status: str, transition: str) -> None:
    assert run(note(status))[0] == [f"{REF}:{transition}:1"]


def test_a_whole_life_in_order() -> None:
    later = "Sun, 22 Nov 2026 01:45:00 GMT"
    ids, _ = run(
        note("Scheduled", 0),
        note("Scheduled", 10, NotBefore=later),
        note("Started", 20),
        note("Completed", 30),
    )
    assert ids[0] == f"{REF}:Scheduled:1"
    assert ids[1].startswith(f"{REF}:Updated:1:") and ids[1].endswith(":1")
    assert ids[2:] == [f"{REF}:Started:1", f"{REF}:Completed:1"]


def test_updated_carries_the_changes() -> None:
    record = decide(None, note("Scheduled", 0)).record
    decision = decide(record, note("Scheduled", 10, DurationInSeconds=30))
    assert decision.transition is Transition.UPDATED
    assert decision.changes == {"DurationInSeconds": {"from": -1, "to": 30}}


# -- duplicates and reordering ----------------------------------------------------------------
def test_exact_duplicates_change_nothing() -> None:
    n = note("Scheduled", 0)
    ids, verdicts = run(n, n, note("Started", 5), note("Started", 5), note("Completed", 9))
    assert ids == [f"{REF}:Scheduled:1", f"{REF}:Started:1", f"{REF}:Completed:1"]
    assert verdicts[1] is Verdict.DUPLICATE and verdicts[3] is Verdict.DUPLICATE


def test_started_after_completed_changes_nothing() -> None:
    ids, verdicts = run(note("Scheduled", 0), note("Completed", 30), note("Started", 20))
    assert ids == [f"{REF}:Scheduled:1", f"{REF}:Completed:1"]
    assert verdicts[-1] is Verdict.STALE


def test_a_late_scheduled_after_the_end_is_stale_not_a_reappearance() -> None:
    ids, verdicts = run(
        note("Scheduled", 0), note("Started", 10), note("Completed", 20), note("Scheduled", 0)
    )
    assert ids == [f"{REF}:Scheduled:1", f"{REF}:Started:1", f"{REF}:Completed:1"]
    assert verdicts[-1] is Verdict.STALE


def test_completed_first_then_the_rest_late() -> None:
    ids, _ = run(note("Completed", 30), note("Started", 20), note("Scheduled", 0))
    assert ids == [f"{REF}:Completed:1"]


def test_scheduled_after_started_is_stale() -> None:
    ids, verdicts = run(note("Started", 10), note("Scheduled", 0))
    assert ids == [f"{REF}:Started:1"] and verdicts[-1] is Verdict.STALE


def test_an_older_version_arriving_late_does_not_undo_the_newer() -> None:
    a, b = "Sun, 22 Nov 2026 01:35:00 GMT", "Sun, 22 Nov 2026 01:45:00 GMT"
    ids, verdicts = run(
        note("Scheduled", 0, NotBefore=a),
        note("Scheduled", 10, NotBefore=b),
        note("Scheduled", 0, NotBefore=a),  # the first one again, delivered late
    )
    assert len(ids) == 2 and verdicts[-1] is Verdict.STALE


def test_a_b_a_is_three_distinct_ids_like_the_forwarder() -> None:
    a, b = "Sun, 22 Nov 2026 01:35:00 GMT", "Sun, 22 Nov 2026 01:45:00 GMT"
    ids, _ = run(
        note("Scheduled", 0, NotBefore=a),
        note("Scheduled", 10, NotBefore=b),
        note("Scheduled", 20, NotBefore=a),
        note("Scheduled", 30, NotBefore=b),
    )
    assert len(set(ids)) == 4


def test_the_event_coming_back_after_its_end_opens_the_next_appearance() -> None:
    ids, _ = run(note("Scheduled", 0), note("Canceled", 10), note("Scheduled", 20))
    assert ids == [f"{REF}:Scheduled:1", f"{REF}:Cancelled:1", f"{REF}:Scheduled:2"]
    # ...and a late copy of the first end does not close the new one.
    ids, verdicts = run(
        note("Scheduled", 0), note("Canceled", 10), note("Scheduled", 20), note("Canceled", 10)
    )
    assert verdicts[-1] is Verdict.STALE


def test_a_second_end_is_a_duplicate() -> None:
    ids, verdicts = run(note("Started", 0), note("Completed", 10), note("Canceled", 20))
    assert ids == [f"{REF}:Started:1", f"{REF}:Completed:1"]
    assert verdicts[-1] is Verdict.DUPLICATE


# -- the same ids as the forwarder ------------------------------------------------------------
@pytest.mark.parametrize("name", scenario_names())
def test_every_scenario_gets_the_forwarders_ids(name: str) -> None:
    """The packaged IMDS scenarios: a forwarder that saw every document, and the notifications
    Azure publishes for the same documents, yield the same message ids in the same order."""
    timeline = scenario_documents(name)
    expected = forwarder_ids(document for _, document in timeline)
    records: dict[str, EventRecord | None] = {}
    got = []
    for body in platform_notifications(timeline):
        n = parse_notification(raw_from_json(body))
        decision = decide(records.get(n.event.key), n)
        if decision.verdict is Verdict.APPLIED:
            records[n.event.key] = decision.record
            if decision.message_id:
                got.append(decision.message_id)
    assert got == expected and expected


@pytest.mark.parametrize("name", scenario_names())
def test_shuffled_and_doubled_delivery_publishes_a_subset_never_more(name: str) -> None:
    timeline = scenario_documents(name)
    expected = forwarder_ids(document for _, document in timeline)
    bodies = platform_notifications(timeline)
    for seed in range(20):
        rng = random.Random(seed)
        delivered = bodies + rng.sample(bodies, len(bodies) // 2)
        rng.shuffle(delivered)
        records: dict[str, EventRecord | None] = {}
        got = []
        for body in delivered:
            n = parse_notification(raw_from_json(body))
            decision = decide(records.get(n.event.key), n)
            if decision.verdict is Verdict.APPLIED:
                records[n.event.key] = decision.record
                if decision.message_id:
                    got.append(decision.message_id)
        assert len(got) == len(set(got)), "an id was published twice"
        assert set(got) <= set(expected), set(got) - set(expected)
        # Each event's last notification (its end) always gets through, whatever came before.
        ends = {i for i in expected if ":Completed:" in i or ":Cancelled:" in i}
        assert ends <= set(got)


# -- stateful: any order, any duplicates ------------------------------------------------------
NOT_BEFORES = [f"Sun, 22 Nov 2026 01:{m:02d}:00 GMT" for m in (35, 40, 45)]


RANKS = {"Scheduled": 0, "Updated": 0, "Started": 1, "Completed": 2, "Cancelled": 2}


class Deliveries(RuleBasedStateMachine):
    """One event's true life (Scheduled versions, maybe Started, an end), notifications
    delivered in any order with repeats, through the ingestor with a store and a publisher.

    What holds whatever the order: no id twice; the lifecycle never goes backwards; Scheduled,
    Started and the end carry the forwarder's ids; an Updated names a content the event really
    had. (An Updated may carry an id the forwarder never gives: when a later version arrives
    before the event's first one and the content then flips back, A -> B -> A seen as B, A, the
    occurrence count of A is one short. It is a message of its own, not a wrong one.)"""

    def __init__(self) -> None:
        super().__init__()
        self.timeline: list[dict[str, Any]] = []
        self.ended = False
        self.started = False
        self.store, self.publisher = MemoryStore(), Publisher()
        self.ingestor = Ingestor(self.store, self.publisher, FixedClock(), sleep=lambda _: None)

    def _add(self, status: str, **fields: Any) -> None:
        at = len(self.timeline) * 10
        self.timeline.append({"status": status, "at": at, "fields": fields})

    @precondition(lambda self: not self.ended and not self.started)
    @rule(not_before=st.sampled_from(NOT_BEFORES))
    def schedule(self, not_before: str) -> None:
        self._add("Scheduled", NotBefore=not_before)

    @precondition(lambda self: not self.ended and not self.started and self.timeline)
    @rule()
    def start(self) -> None:
        self.started = True
        self._add("Started")

    @precondition(lambda self: not self.ended and self.timeline)
    @rule()
    def end(self) -> None:
        self.ended = True
        self._add("Completed" if self.started else "Canceled")

    @precondition(lambda self: self.timeline)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        step = data.draw(st.sampled_from(self.timeline))
        self.ingestor.handle(note(step["status"], step["at"], **step["fields"]))

    def _truth(self) -> list[str]:
        ids, _ = run(*(note(s["status"], s["at"], **s["fields"]) for s in self.timeline))
        return ids

    @invariant()
    def published_transitions_are_true_and_in_lifecycle_order(self) -> None:
        truth = self._truth()
        got = self.publisher.ids
        assert len(got) == len(set(got)), "an id was published twice"
        transitions = [i.split(":")[1] for i in got]
        ranks = [RANKS[t] for t in transitions]
        assert ranks == sorted(ranks), f"the lifecycle went backwards: {transitions}"
        assert transitions.count("Scheduled") <= 1 and transitions[1:].count("Scheduled") == 0
        contents = {
            content_digest(note(s["status"], s["at"], **s["fields"]).event)
            for s in self.timeline
            if s["status"] == "Scheduled"
        }
        for message_id in got:
            if ":Updated:" in message_id:
                assert message_id.split(":")[3] in contents
            else:
                assert message_id in truth

    @invariant()
    def nothing_left_pending(self) -> None:
        for document, _ in self.store.records.values():
            assert document["pending"] == []


TestDeliveries = Deliveries.TestCase
TestDeliveries.pytestmark = [pytest.mark.slow]
TestDeliveries.settings = settings(
    max_examples=examples(150), stateful_step_count=25, deadline=None
)


@settings(max_examples=examples(200), deadline=None)
@given(
    versions=st.lists(st.sampled_from(NOT_BEFORES), min_size=1, max_size=6),
    started=st.booleans(),
    repeats=st.lists(st.integers(min_value=0, max_value=40), max_size=20),
)
def test_in_order_delivery_with_repeats_is_exactly_the_forwarders(
    versions: list[str], started: bool, repeats: list[int]
) -> None:
    """Event Grid redelivers, but in order: the ids are exactly the in-order ones."""
    steps = [("Scheduled", {"NotBefore": nb}) for nb in versions]
    steps += [("Started", {})] if started else []
    steps.append(("Completed" if started else "Canceled", {}))
    notes = [note(status, i * 10, **fields) for i, (status, fields) in enumerate(steps)]
    truth, _ = run(*notes)
    delivered: list[Notification] = []
    for i, n in enumerate(notes):
        delivered.append(n)
        delivered += [n] * repeats.count(i)  # a redelivery right after the original
    store, publisher = MemoryStore(), Publisher()
    ingestor = Ingestor(store, publisher, FixedClock(), sleep=lambda _: None)
    for n in delivered:
        ingestor.handle(n)
    assert publisher.ids == truth


# -- the ingestor: publish after the write, pending survives a failure -------------------------
def test_published_messages_follow_the_contract() -> None:
    store, publisher = MemoryStore(), Publisher()
    ingestor = Ingestor(store, publisher, FixedClock(), sleep=lambda _: None)
    ingestor.handle(note("Scheduled", 0))
    ingestor.handle(note("Scheduled", 10, DurationInSeconds=30))
    ingestor.handle(note("Canceled", 20))
    assert [e.subject for e in publisher.published] == ["Scheduled", "Updated", "Cancelled"]
    for envelope in publisher.published:
        data = envelope.body["data"]
        jsonschema.validate(data, DATA_SCHEMA, format_checker=FORMATS)
        assert data["documentIncarnation"] is None
        assert data["eventGrid"]["resourceId"].endswith(EVENT_ID)
        parsed = parse_message(envelope.body_bytes(), envelope.message_id)
        assert parsed.observer.vm_name == "web-1" and parsed.incarnation is None
        assert envelope.session_id == REF
        assert envelope.body["source"] == parsed.observer.resource_id
        assert envelope.application_properties["vmName"] == "web-1"
    assert publisher.published[0].body["time"] == "2026-11-22T01:20:00Z"  # the event's time


def test_a_failed_publish_is_retried_from_the_record_on_redelivery() -> None:
    store, publisher = MemoryStore(), Publisher(fail_next=1)
    ingestor = Ingestor(store, publisher, FixedClock(), sleep=lambda _: None)
    n = note("Scheduled", 0)
    with pytest.raises(ConnectionError):
        ingestor.handle(n)  # the host answers 500; Event Grid redelivers
    ((document, _),) = store.records.values()
    assert [p["message_id"] for p in document["pending"]] == [f"{REF}:Scheduled:1"]
    outcome = ingestor.handle(n)  # the redelivery: a duplicate, but the pending goes out
    assert outcome.verdict == "duplicate" and outcome.published == (f"{REF}:Scheduled:1",)
    assert publisher.ids == [f"{REF}:Scheduled:1"]
    ((document, _),) = store.records.values()
    assert document["pending"] == []


def test_pending_of_an_earlier_notification_goes_out_with_the_next() -> None:
    store, publisher = MemoryStore(), Publisher(fail_next=1)
    ingestor = Ingestor(store, publisher, FixedClock(), sleep=lambda _: None)
    with pytest.raises(ConnectionError):
        ingestor.handle(note("Scheduled", 0))
    ingestor.handle(note("Started", 10))
    assert publisher.ids == [f"{REF}:Scheduled:1", f"{REF}:Started:1"]


def test_a_damaged_record_starts_afresh() -> None:
    store, publisher = MemoryStore(), Publisher()
    store.records[REF] = ({"version": 1, "eventId": 5}, "v0")
    ingestor = Ingestor(store, publisher, FixedClock(), sleep=lambda _: None)
    ingestor.handle(note("Started", 0))
    assert publisher.ids == [f"{REF}:Started:1"]


def test_the_record_round_trips_and_rejects_damage() -> None:
    record = decide(None, note("Scheduled", 0)).record
    assert record is not None
    assert EventRecord.from_json(record.to_json()) == record
    for broken in (
        {**record.to_json(), "version": 2},
        {**record.to_json(), "status": "Frozen"},
        {**record.to_json(), "at": "soon"},
        {**record.to_json(), "last": {"EventId": 1}},
        {**record.to_json(), "pending": [{"message_id": "x"}]},
        {**record.to_json(), "life": {"appearance": 0}},
    ):
        with pytest.raises((ValueError, KeyError, TypeError)):
            EventRecord.from_json(broken)


def test_times_unknown_fall_back_to_the_status_order() -> None:
    def untimed(status: str, **fields: Any) -> Notification:
        n = note(status, 0, **fields)
        return Notification(n.id, None, n.status, n.event, n.parent, n.resource_id, n.topic)

    ids, verdicts = run(untimed("Scheduled"), untimed("Started"), untimed("Scheduled"))
    assert ids == [f"{REF}:Scheduled:1", f"{REF}:Started:1"] and verdicts[-1] is Verdict.STALE
    ids, verdicts = run(untimed("Completed"), untimed("Scheduled"))
    assert verdicts[-1] is Verdict.STALE  # an unknown time never reopens an ended event


def test_observation_time_falls_back_to_the_clock_when_unknown() -> None:
    store, publisher = MemoryStore(), Publisher()
    clock = FixedClock(T0 + timedelta(hours=1))
    n = note("Scheduled", 0)
    untimed = Notification(n.id, None, n.status, n.event, n.parent, n.resource_id, n.topic)
    Ingestor(store, publisher, clock, sleep=lambda _: None).handle(untimed)
    assert publisher.published[0].body["time"] == "2026-11-22T02:20:00Z"
