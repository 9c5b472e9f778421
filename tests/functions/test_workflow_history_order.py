"""The history orders an event by its life, never by an observer's clock (hostile review 23c,
item 4), and times it shows are bounded by the app's clock.

``test_a_fast_clock_does_not_hide_an_updated``, ``test_a_message_dated_2099_...`` and
``test_an_action_goes_to_the_appearance_its_cause_names`` failed on the code before (main at
3a4e49b): content by the message's ``time``, actions placed by ``at``. The state machine-like
property below generated the same breaks (content from the skewed Scheduled, last_seen 2099).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.history import calendar
from functions.history.core import EventSummary, History, entry_for, summarize
from functions.history.endpoints import calendar_feed
from sebridge import lifecycle
from sebridge.contract.events import Envelope, Transition, event_message, held_message
from tests.fixtures import golden
from tests.functions.history_support import (
    POOL,
    T0,
    MemoryHistoryStore,
    imds_event,
    scope_key,
    stored,
    verified,
)
from tests.support.budget import examples

WEB2 = dataclasses.replace(golden.OBSERVER, vm_name="web-2")
WINDOW = timedelta(days=30)


def nb(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def _history() -> tuple[History, MemoryHistoryStore]:
    store = MemoryHistoryStore()
    return History(store, timedelta(days=90)), store


def test_a_fast_clock_does_not_hide_an_updated() -> None:
    """skew.py: web-1's clock 10 minutes fast sends the Scheduled (NotBefore 03:00); web-2
    sends the Updated to 09:00 two minutes later. Before: NotBefore 03:00 with updates 1."""
    history, _ = _history()
    summary = skewed_update(history)
    text = calendar.feed([summary], T0 + timedelta(minutes=3), WINDOW)
    assert "DTSTART:20261122T090000Z" in text and "SEQUENCE:1" in text


def skewed_update(history: History) -> EventSummary:
    """The skew.py case on ``history`` (the Azurite test runs it on the table too): the
    stored summary, checked."""
    n1, n2 = T0 + timedelta(hours=2), T0 + timedelta(hours=8)
    ev1 = imds_event(golden.EVENT_ID, NotBefore=nb(n1))
    life, mid1 = lifecycle.advance(None, "Scheduled", ev1)
    ev2 = imds_event(golden.EVENT_ID, NotBefore=nb(n2))
    _, mid2 = lifecycle.advance(life, "Updated", ev2)
    scheduled = event_message(
        Transition.SCHEDULED, ev1, golden.OBSERVER, 1, T0 + timedelta(minutes=10), message_id=mid1
    )
    updated = event_message(
        Transition.UPDATED,
        ev2,
        WEB2,
        2,
        T0 + timedelta(minutes=2),
        message_id=mid2,
        changes={"NotBefore": {"from": nb(n1), "to": nb(n2)}},
    )
    for envelope in (updated, scheduled):  # and in either arrival order
        history.record(verified(envelope), T0 + timedelta(minutes=3))
    found = history.store.summary(scope_key())
    summary = found.summary if found else None
    assert summary is not None
    assert summary.latest.not_before == n2 and summary.latest.updates == 1
    # the fast clock's time is shown no later than the app received it
    assert summary.latest.scheduled_at == T0 + timedelta(minutes=3)
    return summary


def test_a_message_dated_2099_shows_the_receive_time() -> None:
    """future.py: a same-scope VM sends an Updated dated 2099; the genuine Started and
    Completed follow. Before: last_seen 2099 for good."""
    history, store = _history()
    ev = imds_event(golden.EVENT_ID, NotBefore=nb(T0 + timedelta(hours=1)))
    life, m1 = lifecycle.advance(None, "Scheduled", ev)
    history.record(
        verified(event_message(Transition.SCHEDULED, ev, golden.OBSERVER, 1, T0, message_id=m1)),
        T0,
    )
    far = datetime(2099, 1, 1, tzinfo=T0.tzinfo)
    bogus = imds_event(golden.EVENT_ID, NotBefore=nb(far))
    _, mb = lifecycle.advance(life, "Updated", bogus)
    history.record(
        verified(
            event_message(
                Transition.UPDATED, bogus, WEB2, 2, far, message_id=mb, changes={"NotBefore": {}}
            )
        ),
        T0 + timedelta(minutes=1),
    )
    started = imds_event(golden.EVENT_ID, "Started")
    life2, ms = lifecycle.advance(life, "Started", started)
    _, mc = lifecycle.advance(life2, "Completed", started)
    end = T0 + timedelta(hours=1, minutes=5)
    for name, mid, at in (
        (Transition.STARTED, ms, T0 + timedelta(hours=1)),
        (Transition.COMPLETED, mc, end),
    ):
        history.record(
            verified(event_message(name, started, golden.OBSERVER, 3, at, message_id=mid)), at
        )
    summary = stored(store)
    assert summary is not None and summary.latest.state == "Completed"
    assert summary.last_seen == end
    # the genuine Started places it: back in the calendar, where it happened, a new revision
    text = calendar_feed(history, end + timedelta(hours=1), WINDOW).body
    assert text.count("BEGIN:VEVENT") == 1
    assert "DTSTART:20261122T020000Z" in text and "SEQUENCE:2" in text
    assert (
        max(t for t in (summary.latest.first_seen, summary.latest.last_seen) if t is not None)
        <= end
    )


def _held(event_id: str, fields: dict[str, Any], cause: str, at: datetime) -> Envelope:
    return held_message(
        imds_event(event_id, **fields),
        golden.OBSERVER,
        1,
        at,
        source="urn:sebridge:function:lb-pools",
        cause=cause,
        pool=POOL,
        healthy=0,
        minimum=1,
        vms=["web-1"],
    )


def test_an_action_goes_to_the_appearance_its_cause_names() -> None:
    """The event came back (appearance 2); the Held of its second Scheduled carries a time
    before the first appearance (a clock behind). Before: counted in appearance 1."""
    history, store = _history()
    ev = imds_event(golden.EVENT_ID, NotBefore=nb(T0 + timedelta(hours=1)))
    life, s1 = lifecycle.advance(None, "Scheduled", ev)
    life, c1 = lifecycle.advance(life, "Cancelled", ev)
    ev2 = imds_event(golden.EVENT_ID, NotBefore=nb(T0 + timedelta(hours=3)))
    life, s2 = lifecycle.advance(life, "Scheduled", ev2)
    assert s2.endswith(":Scheduled:2")
    for i, (name, event, mid) in enumerate(
        (
            (Transition.SCHEDULED, ev, s1),
            (Transition.CANCELLED, ev, c1),
            (Transition.SCHEDULED, ev2, s2),
        )
    ):
        at = T0 + timedelta(minutes=i)
        history.record(
            verified(event_message(name, event, golden.OBSERVER, 1, at, message_id=mid)), at
        )
    held = _held(
        golden.EVENT_ID, {"NotBefore": nb(T0 + timedelta(hours=3))}, s2, T0 - timedelta(days=1)
    )
    assert held.message_id.split(":")[2] == "2"  # the id names its cause's appearance
    history.record(verified(held), T0 + timedelta(minutes=5))
    summary = stored(store)
    assert summary is not None
    first, second = summary.appearances
    assert (first.number, first.held, first.held_at) == (1, False, None)
    assert second.number == 2 and second.held and second.held_pool == POOL


# ---- every skew and every arrival order: one summary ---------------------------------------
SKEWS = st.one_of(
    st.integers(-86_400, 86_400).map(lambda s: timedelta(seconds=s)),
    st.sampled_from([timedelta(days=-3650), timedelta(days=365 * 70)]),  # far past, 2096
)


@st.composite
def lives(draw: st.DrawFn) -> list[tuple[Transition, Envelope]]:
    """One event's messages in the order of its life (1-2 appearances, 0-2 Updateds each, a
    Held, the end), each from an observer whose clock is off by a drawn skew."""
    out: list[tuple[Transition, Envelope]] = []
    life: lifecycle.Life | None = None
    real = T0
    appearances = draw(st.integers(1, 2))
    for number in range(1, appearances + 1):
        fields: dict[str, Any] = {"NotBefore": nb(T0 + timedelta(hours=number))}
        steps: list[tuple[str, dict[str, Any]]] = [("Scheduled", {})]
        for hours in draw(st.lists(st.integers(2, 40), max_size=2)):
            steps.append(("Updated", {"NotBefore": nb(T0 + timedelta(hours=hours))}))
        held = draw(st.booleans())
        last = number == appearances
        end = draw(st.sampled_from(["Completed", "Cancelled"])) if last else "Cancelled"
        if end == "Completed":
            steps.append(("Started", {}))
        steps.append((end, {}))
        for i, (name, change) in enumerate(steps):
            fields.update(change)
            status = "Started" if name in ("Started", "Completed") else "Scheduled"
            event = imds_event(golden.EVENT_ID, status, **fields)
            life, mid = lifecycle.advance(life, name, event)
            real += timedelta(minutes=1)
            skew = draw(SKEWS)
            observer = dataclasses.replace(
                golden.OBSERVER, vm_name=f"web-{draw(st.integers(1, 3))}"
            )
            changes = {"NotBefore": {"from": "a", "to": "b"}} if name == "Updated" else None
            envelope = event_message(
                Transition(name), event, observer, 1, real + skew, message_id=mid, changes=changes
            )
            out.append((Transition(name), envelope))
            if held and i == 0:
                at = real + draw(SKEWS)
                out.append((Transition.HELD, _held(golden.EVENT_ID, dict(fields), mid, at)))
    return out


def _view(summary: EventSummary) -> object:
    """What the summary says of the event, without the times observers gave."""
    return (
        summary.vms,
        summary.scope,
        [
            (
                a.number,
                a.state,
                a.event_type,
                a.not_before,
                a.duration_seconds,
                a.resources,
                a.updates,
                a.held,
                a.held_pool,
                a.sources,
            )
            for a in summary.appearances
        ],
    )


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=lives(), data=st.data())
def test_the_summary_is_the_same_for_every_skew_and_arrival_order(
    messages: list[tuple[Transition, Envelope]], data: st.DataObject
) -> None:
    """Arrival order: any, except that two Updateds of one appearance arrive in the order they
    happened (the app orders those by when it records them; IMDS changes minutes apart)."""
    arrival = data.draw(st.permutations(range(len(messages))))
    updated = [i for i, (t, _) in enumerate(messages) if t is Transition.UPDATED]
    positions = sorted(arrival.index(i) for i in updated)
    arrival = list(arrival)
    for i, position in zip(updated, positions, strict=True):
        arrival[position] = i  # the Updateds in their life order, at the drawn places
    received = T0 + timedelta(hours=1)
    entries = [
        e
        for k, i in enumerate(arrival)
        if (e := entry_for(verified(messages[i][1]), received + timedelta(seconds=k)))
    ]
    in_life = [
        e
        for k, (_, m) in enumerate(messages)
        if (e := entry_for(verified(m), received + timedelta(seconds=k)))
    ]
    # the reference: no skew, received in the order of the event's life
    reference = summarize([dataclasses.replace(e, at=e.recorded_at) for e in in_life])
    summary = summarize(entries)
    assert summary is not None and reference is not None
    assert _view(summary) == _view(reference)
    last = received + timedelta(seconds=len(messages))
    for a in summary.appearances:
        shown = [a.first_seen, a.last_seen, a.scheduled_at, a.started_at, a.ended_at, a.held_at]
        assert all(t <= last for t in shown if t is not None)
