"""The history's table adapter against Azurite: rows keyed by message, summaries under their
ETag, listing by filter, retention; and writers racing on one event through the real table."""

from __future__ import annotations

from datetime import timedelta

import pytest
from azure.identity import ManagedIdentityCredential

from emulators.azurite import Azurite
from emulators.fakes.identity import FakeIdentity
from functions.adapters.history_table import TableHistoryStore
from functions.history.core import (
    History,
    PurgeSchedule,
    SummaryConflict,
    entry_for,
    parse_query,
    summarize,
)
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
    assert all(isinstance(e, SummaryConflict) for e in errors)
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
