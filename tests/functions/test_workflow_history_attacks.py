"""The hostile review of the history (issue 26 part A), each break as a test of the core.

Every test here failed on the code before the history was keyed by scope and bounded by
construction (main at 0547e87): the numbers in the docstrings are the review's. The adapter's
side of the same promises (indexes, paged reads, a table that is gone) is tested against Azurite
in tests/integration/test_history_azurite.py.
"""

from __future__ import annotations

import dataclasses
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import icalendar
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.history import calendar
from functions.history.core import (
    EARLIEST,
    LATEST,
    PROPERTY_UNITS,
    History,
    PurgeSchedule,
    QueryError,
    StoreRecorder,
    StoreUnavailable,
    entry_for,
    entry_properties,
    event_key,
    parse_query,
    summarize,
    summary_from_properties,
    summary_properties,
    utf16_units,
)
from functions.history.endpoints import calendar_feed
from functions.shared.transient import RetryWindow
from sebridge import lifecycle
from sebridge.contract.events import Envelope, Transition, event_message
from tests.fixtures import golden
from tests.functions.history_support import (
    T0,
    Lifecycle,
    MemoryHistoryStore,
    imds_event,
    scope_key,
    stored,
    verified,
)
from tests.functions.support import AVAILABILITY_SET_ID
from tests.support.budget import examples

NOW = T0 + timedelta(minutes=10)
WINDOW = timedelta(days=30)
DB_SET = AVAILABILITY_SET_ID.replace("as-web", "as-db")
DB_1 = dataclasses.replace(
    golden.OBSERVER,
    vm_name="db-1",
    vm_id="5c1a2c2a-79e3-4bd2-9a55-0000000000db",
    resource_id=golden.OBSERVER.resource_id.replace("web-1", "db-1"),
)
REF = lifecycle.event_ref(golden.EVENT_ID)


class Clock:
    """A monotonic clock and a sleep that advances it: the retry window's waits, counted."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def window(self, seconds: float = 120.0) -> RetryWindow:
        return RetryWindow(seconds=seconds, sleep=self.sleep, monotonic=lambda: self.now)


def _history(store: MemoryHistoryStore, days: int = 90, clock: Clock | None = None) -> History:
    window = (clock or Clock()).window()
    return History(store, timedelta(days=days), PurgeSchedule(), window=window)


def _forged(name: str, message_id: str, at: datetime, **fields: Any) -> Envelope:
    """What a verified VM of another availability set (db-1 in as-db) can send: a real
    event's EventId, naming only itself."""
    status = "Started" if name in ("Started", "Completed") else "Scheduled"
    event = imds_event(golden.EVENT_ID, status, Resources=["db-1"], **fields)
    changes = {"NotBefore": {"from": "a", "to": "b"}} if name == "Updated" else None
    return event_message(
        Transition(name), event, DB_1, 1, at, message_id=message_id, changes=changes
    )


def _vevents(text: str) -> dict[str, icalendar.cal.Component]:
    parsed = icalendar.Calendar.from_ical(text)
    return {str(e["UID"]): e for e in parsed.walk("VEVENT")}


# ---- 1. another scope's messages -----------------------------------------------------------
def test_another_scope_can_never_touch_this_scopes_event() -> None:
    """Break 1: db-1 (as-db) sent Cancelled, a later Updated and 20 invented appearances with
    web-1's EventId; the calendar entry was cancelled, moved, then gone."""
    store = MemoryHistoryStore()
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=600)
    for message in life.messages:
        history.record(verified(message), NOW)
    genuine = stored(store)
    assert genuine is not None
    later = T0 + timedelta(hours=2)
    forged = [
        _forged("Cancelled", lifecycle.message_id(REF, "Cancelled", 1), later),
        _forged(
            "Updated",
            f"{REF}:Updated:1:forged",
            later,
            NotBefore="Mon, 23 Nov 2026 09:00:00 GMT",
            Description="moved by someone else",
        ),
        *(
            _forged("Scheduled", lifecycle.message_id(REF, "Scheduled", n), later)
            for n in range(999_981, 1_000_001)
        ),
    ]
    for message in forged:
        history.record(verified(message, DB_SET), NOW)

    assert stored(store) == genuine  # not a field of it changed
    feed = _vevents(calendar_feed(history, NOW, WINDOW).body)
    mine = feed[f"{scope_key()}-1@sebridge"]
    assert str(mine["STATUS"]) == "CONFIRMED"
    assert mine.decoded("DTSTART") == genuine.latest.when
    # what db-1 said is an entry of its own scope, not a word of it in web-1's
    timelines = history.timeline(event_key(golden.EVENT_ID))
    assert sorted(t.summary.key for t in timelines) == sorted(
        [scope_key(), scope_key(availability_set=DB_SET)]
    )
    theirs = next(t for t in timelines if t.summary.key != scope_key())
    assert theirs.summary.vms == ("db-1",)
    assert {e.observer for t in timelines if t.summary.key == scope_key() for e in t.entries} == {
        "web-1"
    }


def test_another_scopes_completed_closes_nothing_of_this_scope() -> None:
    """Hostile review of issue 23, round two, break 5 (checked on the scoped history): db-1
    (as-db) sends an Updated a week later and a Completed with web-1's EventId; web-1's event
    stays Scheduled, at its NotBefore, on the calendar."""
    store = MemoryHistoryStore()
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=600)
    for message in life.messages:
        history.record(verified(message), NOW)
    genuine = stored(store)
    assert genuine is not None
    later = T0 + timedelta(minutes=2)
    for message in (
        _forged(
            "Updated", f"{REF}:Updated:1:later", later, NotBefore="Sun, 29 Nov 2026 01:35:00 GMT"
        ),
        _forged("Completed", lifecycle.message_id(REF, "Completed", 1), later),
    ):
        history.record(verified(message, DB_SET), NOW)
    assert stored(store) == genuine
    assert genuine.latest.state == "Scheduled"
    mine = _vevents(calendar_feed(history, NOW, WINDOW).body)[f"{scope_key()}-1@sebridge"]
    assert str(mine["STATUS"]) == "CONFIRMED"


def test_an_event_seen_by_two_scopes_is_two_entries() -> None:
    store = MemoryHistoryStore()
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled")
    history.record(verified(life.messages[0]), NOW)
    history.record(verified(life.messages[0], DB_SET), NOW)
    assert len(store.stored) == 2
    assert len(history.timeline(event_key(golden.EVENT_ID))) == 2


# ---- 2. a summary too big to store ------------------------------------------------------
def _fits(properties: dict[str, Any]) -> None:
    """What Azure Table takes in one entity: each string within 32,767 UTF-16 units, at most
    252 properties of ours, 1 MiB in all."""
    assert len(properties) <= 248
    total = 0
    for name, value in properties.items():
        if isinstance(value, str):
            assert utf16_units(value) <= PROPERTY_UNITS, name
            total += 2 * utf16_units(value)
    assert total < 1024 * 1024


_ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=3000) | st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["😀", '"', "\\", "\u2028", "é", "\x00"]),
    st.integers(0, 4000),
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(description=_ANY_TEXT, reason=_ANY_TEXT, by=_ANY_TEXT)
def test_every_summary_fits_one_row_and_reads_back_the_same(
    description: str, reason: str, by: str
) -> None:
    """Break 2: an Updated whose Description was 2,000 emoji (49,482 characters once escaped,
    twice in the summary) froze the event for good."""
    life = Lifecycle()
    life.transition("Scheduled", Description=description)
    life.transition("Updated", Description=description[::-1])
    life.approved(by=by, reason=reason)
    life.prepared(by=by)
    life.transition("Started")
    life.transition("Completed")
    entries = [e for m in life.messages if (e := entry_for(verified(m), NOW))]
    for entry in entries:
        _fits(entry_properties(entry))
    summary = summarize(entries)
    assert summary is not None
    properties = summary_properties(summary)
    _fits(properties)
    assert summary_from_properties(properties) == summary
    assert summary.latest.state == "Completed"


def test_a_huge_description_is_stored_once_and_a_redelivery_writes_nothing() -> None:
    store = MemoryHistoryStore()
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Updated", Description="😀" * 2000)
    life.approved(reason="😀" * 5000)
    life.transition("Started")
    for message in life.messages:
        history.record(verified(message), NOW)
    summary = stored(store)
    assert summary is not None and summary.latest.state == "Started"
    text = "".join(v for v in summary_properties(summary).values() if isinstance(v, str))
    clipped = "😀" * 1999 + "\u2026"  # 2,000 characters, cut at a character boundary
    assert text.count(clipped) == 1  # the Description once, not also at the top level
    assert 0 < len(summary.latest.approval_reason) <= 2000
    writes = store.summary_writes
    for message in life.messages:
        assert history.record(verified(message), NOW).written is False
    assert store.summary_writes == writes


# ---- 5, 6. storage faults -----------------------------------------------------------------
def test_a_storage_outage_is_ridden_out_within_the_window_then_raised() -> None:
    """Break 5: each delivery failed at the first fault; 10 deliveries in ~30 s, dead-lettered."""
    store, clock = MemoryHistoryStore(), Clock()
    history = _history(store, clock=clock)
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Started")
    store.faults = 6
    history.record(verified(life.messages[0]), NOW)
    assert stored(store) is not None and len(clock.waits) == 6
    clock.waits.clear()
    store.faults = 10**9
    with pytest.raises(StoreUnavailable):
        history.record(verified(life.messages[1]), NOW)
    assert sum(clock.waits) == pytest.approx(120.0)  # the window, then Service Bus redelivers
    assert max(clock.waits) <= 15.0
    store.faults = 0
    history.record(verified(life.messages[1]), NOW)  # the redelivery
    summary = stored(store)
    assert summary is not None and summary.latest.state == "Started"


def test_a_fault_that_no_retry_repairs_is_raised_at_once() -> None:
    class Forbidden(MemoryHistoryStore):
        def add(self, entries):  # type: ignore[no-untyped-def]
            raise PermissionError("403: no role")

    clock = Clock()
    life = Lifecycle()
    life.transition("Scheduled")
    with pytest.raises(PermissionError):
        _history(Forbidden(), clock=clock).record(verified(life.messages[0]), NOW)
    assert clock.waits == []


def test_restored_is_kept_through_an_outage_and_written_later() -> None:
    """Break 6: one storage failure and lb-pools' Restored was gone for good."""
    store, clock = MemoryHistoryStore(), Clock()
    history = _history(store, clock=clock)
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Cancelled")
    history.record(verified(life.messages[0]), NOW)
    store.faults = 10**9
    StoreRecorder(history, "lb-pools").record(
        verified(life.messages[1]), "Restored", NOW, {"nics": 1}
    )  # never raises into the workflow
    assert len(history.pending) == 1
    store.faults = 0
    outcome = history.record(verified(life.messages[1]), NOW)
    assert outcome.replayed == 1 and len(history.pending) == 0
    restored = [e for e in store.entries(scope_key()).entries if e.name == "Restored"]
    assert [(e.source, e.details) for e in restored] == [("lb-pools", {"nics": 1})]
    summary = stored(store)
    assert summary is not None and summary.latest.restored_at == NOW


# ---- 4, 7. many rows, wide events ----------------------------------------------------------
def test_bulk_rows_never_crowd_out_the_lifecycle() -> None:
    """Break 4: 600 Prepared rows (200 VMs x 3 causes) hid the Updated, Started and Scheduled
    rows from the 500-row read."""
    store = MemoryHistoryStore(read_all=50, read_per_kind=10)
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 02:00:00 GMT")
    for _ in range(60):
        life.prepared()
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 03:00:00 GMT")
    life.transition("Started")
    for message in life.messages:
        history.record(verified(message), NOW)
    summary = stored(store)
    assert summary is not None and summary.complete is False
    latest = summary.latest
    assert latest.updates == 2 and latest.state == "Started"
    assert latest.scheduled_at is not None and latest.started_at is not None
    assert latest.not_before == datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def _vm(n: int) -> str:
    return f"vm-{n:03d}-" + "x" * 57  # 64 characters, Azure's longest VM name


def test_a_wide_event_keeps_every_vm_and_a_redelivery_is_a_no_op() -> None:
    """Break 7: 200 VMs with 64-character names: 20 kept, ?vm= found 20 of 200, and every
    redelivery wrote the summary (and a workbook line) again."""
    vms = [_vm(n) for n in range(200)]
    store = MemoryHistoryStore()
    history = _history(store)
    life = Lifecycle()
    life.transition("Scheduled", Resources=vms)
    history.record(verified(life.messages[0]), NOW)
    summary = stored(store)
    assert summary is not None and summary.vms == tuple(vms)
    _fits(summary_properties(summary))
    for vm in (vms[0], vms[117], vms[-1]):
        assert [s.key for s in store.latest(parse_query({"vm": vm})).summaries] == [scope_key()]
    writes = store.summary_writes
    assert history.record(verified(life.messages[0]), NOW).written is False
    assert store.summary_writes == writes


# ---- 8. retention on the app's clock ------------------------------------------------------
def test_retention_is_measured_on_the_apps_clock() -> None:
    """Break 8: an event reported with time = now - 100 days was deleted by the call that
    wrote it; one reported at 2099 was never purged."""
    store = MemoryHistoryStore()
    old = Lifecycle(clock=NOW - timedelta(days=100))
    old.transition("Scheduled")
    future = Lifecycle(
        event_id="00000000-0000-4000-8000-000000000099", clock=datetime(2099, 1, 1, tzinfo=UTC)
    )
    future.transition("Scheduled")
    history = _history(store, days=90)
    history.record(verified(old.messages[0]), NOW)
    history.record(verified(future.messages[0]), NOW)
    assert len(store.stored) == 2
    assert history.purge(NOW + timedelta(days=1)) == 0
    assert history.purge(NOW + timedelta(days=91)) == 2
    assert store.stored == {}


# ---- 9. from/to ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        "0001-01-01T00:00:00+01:00",
        "9999-12-31T23:59:59-01:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31",
        "1600-12-31T23:59:59Z",
        "2026-11-26",
        "2026-11-26T07:00:00.123456+05:30",
    ],
)
def test_every_iso_bound_is_a_valid_bound(raw: str) -> None:
    query = parse_query({"from": raw, "to": raw})
    assert query.start is not None and EARLIEST <= query.start <= LATEST
    assert query.start.tzinfo is not None


@pytest.mark.parametrize(
    "raw",
    [
        "Mon, 01 Jan 0001 00:00:00 GMT",  # read as 2001 by a lenient parser
        "01-01-01",
        "26-11-26T00:00:00Z",
        "2026-13-01",
        "2026-11-26T25:00:00Z",
        "2026-11-26T00:00:00+24:00",
        "now",
        "9" * 80,
    ],
)
def test_anything_else_is_refused(raw: str) -> None:
    with pytest.raises(QueryError, match="not an ISO 8601 time"):
        parse_query({"from": raw})


@settings(max_examples=examples(300), deadline=None)
@given(raw=st.text(max_size=40) | st.from_regex(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:+\-Z.]{0,20}"))
def test_a_bound_is_a_valid_time_or_a_query_error(raw: str) -> None:
    try:
        query = parse_query({"to": raw})
    except QueryError:
        return
    assert query.end is None or EARLIEST <= query.end <= LATEST


def test_a_time_without_offset_is_utc_whatever_the_process_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Pacific/Kiritimati")
    time.tzset()
    try:
        query = parse_query({"from": "2026-11-26T07:00:00"})
    finally:
        monkeypatch.undo()
        time.tzset()
    assert query.start == datetime(2026, 11, 26, 7, 0, tzinfo=UTC)


# ---- 10. iCalendar DATE-TIMEs ---------------------------------------------------------------
def test_every_date_time_has_four_digit_years() -> None:
    """Break 10: a VM clock at year 1 made CREATED:10101T000000Z."""
    assert calendar.stamp(datetime(1, 1, 1, tzinfo=UTC)) == "16010101T000000Z"
    assert calendar.stamp(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)) == "99991231T235959Z"
    for clock, not_before in [
        (datetime(1, 1, 1, 0, 5, tzinfo=UTC), "Mon, 01 Jan 0001 00:00:00 GMT"),
        (datetime(9999, 12, 31, 23, 0, tzinfo=UTC), "Fri, 31 Dec 9999 23:30:00 GMT"),
    ]:
        life = Lifecycle(clock=clock - timedelta(minutes=2))
        life.transition("Scheduled", NotBefore=not_before, DurationInSeconds=86_400)
        summary = summarize([e for m in life.messages if (e := entry_for(verified(m), NOW))])
        assert summary is not None
        text = calendar.feed([summary], NOW, timedelta(days=365 * 9000))
        stamps = re.findall(r"^(?:DTSTART|DTEND|CREATED|LAST-MODIFIED|DTSTAMP):(.*)\r$", text, re.M)
        assert len(stamps) == 5
        assert all(re.fullmatch(r"\d{8}T\d{6}Z", s) for s in stamps), stamps
        (event,) = icalendar.Calendar.from_ical(text).walk("VEVENT")
        assert event.errors == []
