"""The moment mechanism (functions/lb_pools/moments.py MomentBook) under random sequences of
what Service Bus and the workflows do: moments set and moved (Scheduled, Updated), spent (a
drain now), dropped (Cancelled), scheduled messages delivered when due, delivered again, stale
ones delivered after a cancel lost the race, and restarts (a new book over the same records).

Moments are kept per verified scope: two scopes of one EventId (one record) and another event.
Invariants: a delivery acts only for its scope's current moment, at most once per moment, never
after the scope's event was dropped or spent; after every step the scheduler holds at most one
pending message per event and scope, the one the record names."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from functions.lb_pools import moments
from functions.shared.event_record import scoped_event_key
from tests.functions.support import RecordingScheduler, Scheduled
from tests.support.budget import examples

START = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)
# The event in a scope (functions.shared.verified.scoped_key): e1 in two sets, e2 in one.
EVENTS = [
    scoped_event_key("e1", "as-web"),
    scoped_event_key("e1", "as-db"),
    scoped_event_key("e2", "as-web"),
]


class Records:
    """The event records as the pool store keeps them (read, and change under an ETag)."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}

    def read_event(self, event_id: str) -> dict[str, Any]:
        return copy.deepcopy(self.records.get(event_id, {}))

    def update_event(self, event_id: str, change: Callable[[dict[str, Any]], bool]) -> None:
        record = self.read_event(event_id)
        if change(record):
            self.records[event_id] = record


class Moments(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.records = Records()
        self.scheduler = RecordingScheduler()
        self.book = self._new_book()
        self.now = START
        self.expected: dict[str, datetime | None] = {e: None for e in EVENTS}  # current moment
        self.acted: dict[tuple[str, datetime], int] = {}
        self.delivered: list[Scheduled] = []

    def _new_book(self) -> moments.MomentBook:
        return moments.MomentBook(self.records, self.scheduler)  # type: ignore[arg-type]

    @rule(event=st.sampled_from(EVENTS), minutes=st.integers(1, 30))
    def set_moment(self, event: str, minutes: int) -> None:
        at = self.now + timedelta(minutes=minutes)
        self.book.set(event, at, f"{event}:msg", {"time": self.now.isoformat(), "n": minutes})
        self.expected[event] = at

    @rule(event=st.sampled_from(EVENTS))
    def spend(self, event: str) -> None:
        self.book.spend(event, self.now, f"{event}:now", {"time": self.now.isoformat()})
        self.expected[event] = None

    @rule(event=st.sampled_from(EVENTS))
    def drop(self, event: str) -> None:
        self.book.drop(event)
        self.expected[event] = None

    @rule(minutes=st.integers(1, 20))
    def time_passes_and_due_messages_arrive(self, minutes: int) -> None:
        self.now += timedelta(minutes=minutes)
        for entry in self.scheduler.due(self.now):
            self._deliver(entry)

    @precondition(lambda self: bool(self.delivered))
    @rule(data=st.data())
    def a_message_is_delivered_again(self, data: st.DataObject) -> None:
        self._deliver(data.draw(st.sampled_from(self.delivered)))

    @precondition(lambda self: bool(self.scheduler.scheduled))
    @rule(data=st.data())
    def a_cancelled_message_arrives_all_the_same(self, data: st.DataObject) -> None:
        entry = data.draw(st.sampled_from(self.scheduler.scheduled))
        # A cancel that lost the race: the broker delivers the message at its time.
        if entry.sequence in self.scheduler.cancelled and entry.at <= self.now:
            self._deliver(entry)

    @rule()
    def restart(self) -> None:
        self.book = self._new_book()

    def _deliver(self, entry: Scheduled) -> None:
        parsed = moments.parse_due(entry.body)
        event, tok = parsed.key, parsed.token
        self.delivered.append(entry)
        due = self.book.due(event, tok)
        if isinstance(due, str):
            return
        # Acting on it: only the event's current moment, once.
        assert self.expected[event] == due.at, (event, due.at, self.expected[event])
        assert entry.at == due.at
        key = (event, due.at)
        self.acted[key] = self.acted.get(key, 0) + 1
        assert self.acted[key] == 1
        self.book.fired(event, tok)
        self.expected[event] = None

    @invariant()
    def one_pending_message_per_event_and_it_is_the_recorded_one(self) -> None:
        for event in EVENTS:
            pending = [
                e for e in self.scheduler.pending.values() if moments.parse_due(e.body).key == event
            ]
            entry = self.book.read(event)
            if self.expected[event] is None:
                assert pending == []
                assert entry is None or entry.fired or entry.sequence is None
            else:
                assert entry is not None and not entry.fired
                assert [e.sequence for e in pending] == [entry.sequence]
                assert pending[0].at == self.expected[event]


TestMoments = Moments.TestCase
TestMoments.settings = settings(max_examples=examples(150), stateful_step_count=30, deadline=None)
