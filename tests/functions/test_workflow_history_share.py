"""One scope cannot push another's maintenance out of the calendar or the listing (hostile
review 23c, item 3).

``test_a_flood_from_one_scope_leaves_another_in_the_calendar`` (flood.py) and
``test_a_flood_from_one_scope_leaves_another_in_the_listing`` failed on the code before (main at
3a4e49b): the feed held 500 VEVENTs, none the other scope's; the listing 100 of the flood's.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.history.core import EventSummary, History, fair_share
from functions.history.endpoints import CALENDAR_LIMIT, calendar_feed, list_events
from sebridge import lifecycle
from sebridge.contract.events import Transition, event_message
from tests.fixtures import golden
from tests.functions.history_support import T0, MemoryHistoryStore, imds_event, verified
from tests.support.budget import examples

DB_SET = (
    f"/subscriptions/{golden.SUBSCRIPTION}/resourceGroups/rg-web/providers/"
    "Microsoft.Compute/availabilitySets/as-db"
)
DB1 = dataclasses.replace(golden.OBSERVER, vm_name="db-1")


def nb(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def scheduled(history: History, when: datetime, *, db: bool = False) -> str:
    """A new event's Scheduled, NotBefore ``when``: db-1's (scope as-db) or web-1's (as-web)."""
    event_id = str(uuid.uuid4())
    event = imds_event(event_id, NotBefore=nb(when), Resources=["db-1" if db else "web-1"])
    _, mid = lifecycle.advance(None, "Scheduled", event)
    observer = DB1 if db else golden.OBSERVER
    envelope = event_message(Transition.SCHEDULED, event, observer, 1, T0, message_id=mid)
    message = verified(envelope, availability_set=DB_SET) if db else verified(envelope)
    history.record(message, T0)
    return event_id


def flood(history: History, count: int, when: datetime) -> str:
    """db-1's one real event two hours ahead, and ``count`` events web-1 invents at ``when``."""
    real = scheduled(history, T0 + timedelta(hours=2), db=True)
    for _ in range(count):
        scheduled(history, when)
    return real


def test_a_flood_from_one_scope_leaves_another_in_the_calendar() -> None:
    history = History(MemoryHistoryStore(), timedelta(days=90))
    real = flood(history, CALENDAR_LIMIT, T0 + timedelta(hours=1))
    ics = calendar_feed(history, T0 + timedelta(minutes=1), timedelta(days=30)).body
    assert ics.count("BEGIN:VEVENT") == CALENDAR_LIMIT  # still bounded
    assert real in ics


def test_a_flood_from_one_scope_leaves_another_in_the_listing() -> None:
    """The flood dated after the real event: the listing (latest first, 100) held only it."""
    history = History(MemoryHistoryStore(), timedelta(days=90))
    real = flood(history, 150, T0 + timedelta(days=3))
    listed = json.loads(list_events(history, {}).body)
    assert listed["count"] == 100
    assert real in [event["eventId"] for event in listed["events"]]


def _summaries(scopes: list[int]) -> list[EventSummary]:
    history = History(MemoryHistoryStore(), timedelta(days=90))
    for n in scopes:
        scheduled(history, T0 + timedelta(hours=1), db=n == 1)
    found = history.store.upcoming(T0, T0 + timedelta(days=1), 1000)
    return found


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scopes=st.lists(st.sampled_from([0, 1]), min_size=1, max_size=12), limit=st.integers(0, 12))
def test_every_scope_gets_its_equal_share(scopes: list[int], limit: int) -> None:
    summaries = _summaries(scopes)
    chosen = fair_share(summaries, limit)
    assert len(chosen) == min(limit, len(summaries))
    assert [s for s in summaries if s in chosen] == chosen  # the index's order kept
    counts = {k: sum(s.scope_key == k for s in chosen) for k in {s.scope_key for s in summaries}}
    offered = {k: sum(s.scope_key == k for s in summaries) for k in counts}
    for scope, count in counts.items():
        # a scope short of its share got all it had; none got two more than another
        assert count == offered[scope] or all(count >= c - 1 for c in counts.values())
        # and what it got is its first ones
        own = [s for s in summaries if s.scope_key == scope]
        assert [s for s in chosen if s.scope_key == scope] == own[:count]
