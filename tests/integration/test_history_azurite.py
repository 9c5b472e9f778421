"""The history's table adapter against Azurite: rows keyed by message, summaries under their
ETag, listing by filter, retention; and writers racing on one event through the real table."""

from __future__ import annotations

from datetime import datetime, timedelta
from email.utils import format_datetime
from typing import Any

import icalendar
import pytest
from azure.core.credentials import AccessToken
from azure.data.tables import TableClient
from azure.identity import ManagedIdentityCredential

from emulators.azurite import Azurite
from emulators.fakes.identity import FakeIdentity
from emulators.ports import refused_port
from functions.adapters import history_table
from functions.adapters.history_table import TableHistoryStore, split_table_url
from functions.history import endpoints
from functions.history.core import (
    History,
    PurgeSchedule,
    StoreUnavailable,
    SummaryConflict,
    entry_for,
    parse_query,
    summarize,
)
from functions.history.endpoints import calendar_feed
from functions.shared.transient import RetryWindow
from sebridge.imds import isoformat_utc as _iso
from tests.functions.history_support import T0, Lifecycle, scope_key, verified
from tests.functions.support import at_once
from tests.support.storage import azurite_storage, storage_credential, unique

__all__ = ["azurite_storage", "storage_credential"]
pytestmark = pytest.mark.timeout(180)
KEY = scope_key()
NOW = T0 + timedelta(hours=1)


@pytest.fixture
def store(
    azurite_storage: tuple[Azurite, FakeIdentity], storage_credential: ManagedIdentityCredential
) -> TableHistoryStore:
    storage, _ = azurite_storage
    return TableHistoryStore(storage.table_url(unique("history")), storage_credential)


def _life() -> Lifecycle:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=300)
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 01:45:00 GMT")
    life.prepared()
    life.approved()
    life.transition("Started")
    life.transition("Completed")
    return life


def _parsed(envelope):  # type: ignore[no-untyped-def]
    return verified(envelope)


def test_a_redelivered_message_is_the_same_row(store: TableHistoryStore) -> None:
    entry = entry_for(_parsed(_life().messages[0]), NOW)
    assert entry is not None
    store.add([entry])  # creates the table on the way
    store.add([entry])
    assert store.entries(KEY).entries == [entry]


def test_a_summary_is_written_only_over_the_version_read(store: TableHistoryStore) -> None:
    entries = [e for m in _life().messages if (e := entry_for(_parsed(m), NOW))]
    store.add(entries)
    summary = summarize(store.entries(KEY).entries)
    assert summary is not None
    store.save_summary(summary, None)
    with pytest.raises(SummaryConflict):
        store.save_summary(summary, None)  # another writer created it first
    stored = store.summary(KEY)
    assert stored is not None and stored.summary == summary and stored.etag
    store.save_summary(summary, stored)
    with pytest.raises(SummaryConflict):
        store.save_summary(summary, stored)  # stale


def test_writers_racing_on_one_event_lose_no_entry(store: TableHistoryStore) -> None:
    history = History(store, timedelta(days=90), PurgeSchedule())
    messages = _life().messages
    errors = at_once(*(lambda m=m: history.record(_parsed(m), NOW) for m in messages))
    assert all(isinstance(e, SummaryConflict) for e in errors), [repr(e) for e in errors]
    for message in messages:  # Service Bus redelivers what failed; the rest is a no-op
        history.record(_parsed(message), NOW)
    found = store.summary(KEY)
    stored = found.summary if found else None
    assert stored is not None and stored.entries == len(messages)
    assert stored == summarize(store.entries(KEY).entries)
    assert stored.latest.state == "Completed" and stored.latest.updates == 1


def test_listing_filters_and_retention(store: TableHistoryStore) -> None:
    history = History(store, timedelta(days=1), PurgeSchedule(), purge_batch=10)
    for n, vm in enumerate(["web-1", "web-2"]):
        life = Lifecycle(event_id=f"00000000-0000-4000-8000-0000000000a{n}")
        life.transition("Scheduled", Resources=[vm])
        if n:
            life.transition("Started")
        for message in life.messages:
            history.record(_parsed(message), NOW)
    started = store.latest(parse_query({"state": "Started"})).summaries
    assert [s.vms for s in started] == [("web-2",)]
    assert len(store.latest(parse_query({"resourceGroup": "RG-WEB"})).summaries) == 2
    assert len(store.latest(parse_query({"vm": "WEB-1"})).summaries) == 1
    assert store.latest(parse_query({"from": "2026-12-01T00:00:00Z"})).summaries == []
    assert history.purge(NOW + timedelta(days=2)) == 2
    assert store.latest(parse_query({})).summaries == []
    assert store.entries(scope_key("00000000-0000-4000-8000-0000000000a1")).entries == []


# ---- the hostile review's breaks, against the real table (issue 26 part A) --------------------
def _at(moment: datetime) -> str:
    return format_datetime(moment, usegmt=True)


def _event(history: History, n: int, not_before: datetime, **fields: Any) -> None:
    life = Lifecycle(event_id=f"00000000-0000-4000-8000-{n:012d}")
    life.transition("Scheduled", NotBefore=_at(not_before), **fields)
    history.record(_parsed(life.messages[0]), NOW)


def test_the_listing_is_latest_first_from_the_time_index(store: TableHistoryStore) -> None:
    """Break 3: the listing scanned in key (GUID) order and sorted what it had read."""
    history = History(store, timedelta(days=90), PurgeSchedule())
    offsets = [7, 2, 11, 5, 0, 9, 3, 10]
    for n, hours in enumerate(offsets):
        _event(history, n, T0 + timedelta(hours=hours))
    listed = store.latest(parse_query({"limit": "3"})).summaries
    assert [s.latest.not_before for s in listed] == [T0 + timedelta(hours=h) for h in (11, 10, 9)]
    window = store.latest(parse_query({"from": _iso(T0 + timedelta(hours=3)), "limit": "2"}))
    assert [s.latest.not_before for s in window.summaries] == [
        T0 + timedelta(hours=h) for h in (11, 10)
    ]
    ancient = parse_query({"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59-01:00"})
    assert len(store.latest(ancient).summaries) == len(offsets)  # clamped, not datetime'1-01-01'


def test_the_calendar_never_drops_the_next_maintenance(
    store: TableHistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break 3: the feed held the latest 500 and dropped the nearest upcoming events."""
    monkeypatch.setattr(endpoints, "CALENDAR_LIMIT", 4)
    history = History(store, timedelta(days=90), PurgeSchedule())
    now = T0 + timedelta(days=1)
    upcoming = [now + timedelta(hours=h) for h in (30, 2, 50, 1, 70, 5)]
    past = [now - timedelta(hours=h) for h in (3, 1)]
    for n, when in enumerate([*upcoming, *past]):
        _event(history, n, when)
    feed = icalendar.Calendar.from_ical(calendar_feed(history, now, timedelta(days=30)).body)
    starts = sorted(e.decoded("DTSTART") for e in feed.walk("VEVENT"))
    assert starts == sorted(upcoming)[:4]  # the next four, the nearest first


def test_bulk_rows_are_read_kind_by_kind(
    store: TableHistoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break 4: a flood of Prepared rows crowded the lifecycle rows out of the read."""
    monkeypatch.setattr(history_table, "READ_ALL", 20)
    monkeypatch.setattr(history_table, "READ_PER_KIND", 8)
    history = History(store, timedelta(days=90), PurgeSchedule())
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 02:00:00 GMT")
    for _ in range(25):
        life.prepared()
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 03:00:00 GMT")
    life.transition("Started")
    for message in life.messages:
        history.record(_parsed(message), NOW)
    found = store.summary(KEY)
    summary = found.summary if found else None
    assert summary is not None and summary.complete is False
    assert summary.latest.updates == 2 and summary.latest.state == "Started"
    assert summary.latest.scheduled_at is not None


def test_a_huge_description_and_a_wide_event_are_stored(store: TableHistoryStore) -> None:
    """Breaks 2 and 7: 2,000 emoji froze the event (the service refused the summary); 200
    VMs with 64-character names left 20 findable."""
    history = History(store, timedelta(days=90), PurgeSchedule())
    vms = [f"vm-{n:03d}-" + "x" * 57 for n in range(200)]
    life = Lifecycle()
    life.transition("Scheduled", Resources=vms)
    life.transition("Updated", Description="😀" * 2000)
    life.approved(reason='"\\' * 3000)
    life.transition("Started")
    life.transition("Completed")
    for message in life.messages:
        history.record(_parsed(message), NOW)
    found = store.summary(KEY)
    assert found is not None and found.summary is not None
    assert found.summary.latest.state == "Completed" and len(found.summary.vms) == 200
    for vm in (vms[0], vms[150], vms[-1]):
        listed = store.latest(parse_query({"vm": vm.upper()})).summaries
        assert [s.key for s in listed] == [KEY]
    for message in life.messages:  # a redelivery writes nothing
        assert history.record(_parsed(message), NOW).written is False


def test_a_deleted_table_is_created_again(
    azurite_storage: tuple[Azurite, FakeIdentity], storage_credential: ManagedIdentityCredential
) -> None:
    """Break 13: once created, never created again: 3 of 3 writes failed TABLE_NOT_FOUND."""
    storage, _ = azurite_storage
    url = storage.table_url(unique("history"))
    store = TableHistoryStore(url, storage_credential)
    history = History(store, timedelta(days=90), PurgeSchedule())
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Started")
    history.record(_parsed(life.messages[0]), NOW)
    endpoint, table = split_table_url(url)
    with TableClient(endpoint, table, credential=storage_credential) as client:
        client.delete_table()
    history.record(_parsed(life.messages[1]), NOW)
    found = store.summary(KEY)
    assert found is not None and found.summary is not None
    assert found.summary.latest.state == "Started"


def test_a_store_that_does_not_answer_is_retried_within_the_window() -> None:
    """Break 5: the adapter's faults that may pass reach the core as StoreUnavailable, which it
    retries for its window (counted, not waited) and then raises for Service Bus to redeliver."""
    waits: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock[0] += seconds

    window = RetryWindow(seconds=60, sleep=sleep, monotonic=lambda: clock[0])
    life = Lifecycle()
    life.transition("Scheduled")
    with refused_port() as port:  # connections are refused, and no one else is handed it
        store = TableHistoryStore(
            f"https://127.0.0.1:{port}/devstoreaccount1/history", AnonymousCredential()
        )
        history = History(store, timedelta(days=90), PurgeSchedule(), window=window)
        with pytest.raises(StoreUnavailable):
            history.record(_parsed(life.messages[0]), NOW)
    assert len(waits) >= 4 and sum(waits) == pytest.approx(60.0)


class AnonymousCredential:
    """A token for a store nobody answers for (no request ever gets that far)."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("unused", 2**31)
