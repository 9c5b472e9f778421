"""history's core: messages to entries, entries to a summary, whatever the order of arrival.

The promises attacked here: a redelivery writes the same row and changes nothing; any order of
arrival (late, reordered, duplicated, across two appearances) yields the summary of the order
in which things happened; two writers racing on one event's summary lose no entry; retention
deletes what is old, bounded per run; nothing secret is stored.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from functions.history.core import (
    History,
    PurgeSchedule,
    QueryError,
    SummaryConflict,
    entry_for,
    impact_by_type,
    parse_query,
    select,
    summarize,
)
from tests.functions.history_support import (
    T0,
    Lifecycle,
    MemoryHistoryStore,
    scope_key,
    stored,
    verified,
)
from tests.functions.support import at_once
from tests.support.budget import examples

NOW = T0 + timedelta(hours=1)


def _parsed(envelope):  # type: ignore[no-untyped-def]
    return verified(envelope)


def _history(store: MemoryHistoryStore, days: int = 90) -> History:
    return History(store, timedelta(days=days), PurgeSchedule())


def full_life() -> Lifecycle:
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Updated", NotBefore="Sun, 22 Nov 2026 01:45:00 GMT")
    life.held()
    life.prepared()
    life.approved()
    life.transition("Started")
    life.transition("Completed", impact={"measuredSeconds": 7.5, "method": "reboot-gap"})
    return life


def test_every_transition_and_action_becomes_one_entry() -> None:
    entries = [entry_for(_parsed(m), NOW) for m in full_life().messages]
    assert [e.name for e in entries if e] == [
        "Scheduled",
        "Updated",
        "Held",
        "Prepared",
        "Approved",
        "Started",
        "Completed",
    ]
    prepared = next(e for e in entries if e and e.name == "Prepared")
    assert prepared.source == "lb-pools" and prepared.details["vms"] == ["web-1"]
    held = next(e for e in entries if e and e.name == "Held")
    assert held.details["minimum"] == 1 and held.details["pool"].endswith("/pool-a")
    approved = next(e for e in entries if e and e.name == "Approved")
    assert approved.details == {"requestedBy": "approval-gate", "reason": "policy"}
    assert len({e.key for e in entries if e}) == 7


def test_a_redelivery_writes_the_same_row_and_no_new_summary() -> None:
    store, life = MemoryHistoryStore(), full_life()
    history = _history(store)
    for message in life.messages:
        history.record(_parsed(message), NOW)
    rows, writes = dict(store.rows), store.summary_writes
    for message in life.messages:  # every message delivered again
        outcome = history.record(_parsed(message), NOW)
        assert outcome.written is False
    assert store.rows == rows and store.summary_writes == writes


def test_the_summary_tells_the_event() -> None:
    store = MemoryHistoryStore()
    history = _history(store)
    for message in full_life().messages:
        history.record(_parsed(message), NOW)
    summary = stored(store)
    assert summary is not None
    latest = summary.latest
    assert latest.state == "Completed" and latest.updates == 1
    assert latest.not_before is not None and latest.not_before.minute == 45
    assert latest.approved_by == "approval-gate" and latest.prepared_by == "lb-pools"
    assert latest.held_at is not None and latest.held is False  # prepared after the hold
    assert latest.measured_seconds == 7.5 and latest.measure_method == "reboot-gap"
    assert latest.announced_seconds is None  # golden DurationInSeconds is -1
    assert latest.sources == ("forwarder",)
    assert summary.vms == ("web-1", "web-2") and summary.resource_group == "rg-web"
    document = summary.to_json()
    assert document["impact"]["measured"] is True
    assert json.loads(json.dumps(document)) == document


def test_a_completed_event_without_a_measurement_says_so() -> None:
    life = Lifecycle()
    life.transition("Scheduled", DurationInSeconds=300)
    life.transition("Started")
    life.transition("Completed")
    summary = summarize([e for m in life.messages if (e := entry_for(_parsed(m), NOW))])
    assert summary is not None
    assert summary.latest.announced_seconds == 300
    assert summary.to_json()["impact"] == {
        "announcedSeconds": 300,
        "measuredSeconds": None,
        "method": None,
        "measured": False,
        "vms": [],
    }


@pytest.mark.parametrize(
    "impact",
    [{"measuredSeconds": -1}, {"measuredSeconds": "7"}, {"measuredSeconds": True}, "7", None],
)
def test_an_impact_that_is_not_one_is_ignored(impact: object) -> None:
    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Started")
    life.transition("Completed")
    life.messages[-1].body["data"]["impact"] = impact
    summary = summarize([e for m in life.messages if (e := entry_for(_parsed(m), NOW))])
    assert summary is not None and summary.latest.measured_seconds is None


def test_nothing_secret_is_stored() -> None:
    life = Lifecycle()
    life.transition("Scheduled")
    message = life.messages[0]
    message.body["data"]["seal"] = "s3cret-seal"
    message.body["data"]["eventGrid"] = {"topic": "t", "token": "s3cret-token"}
    entry = entry_for(_parsed(message), NOW)
    assert entry is not None and entry.source == "event-grid"
    assert "s3cret" not in json.dumps(entry.to_record())


def _realistic(steps: list[str]) -> list[str]:
    """One Approved per appearance (its id is per appearance) and an action at most once per
    cause (Held and Prepared ids derive from the message before them), as on the topic."""
    out: list[str] = []
    since: set[str] = set()
    for step in steps:
        if step in since or (step == "Approved" and "Approved" in out):
            continue
        since = set() if step == "Updated" else since | {step}
        out.append(step)
    return out


def _lifecycle_plans() -> st.SearchStrategy[list[str]]:
    middle = st.lists(st.sampled_from(["Updated", "Held", "Prepared", "Approved"]), max_size=5).map(
        _realistic
    )
    end = st.sampled_from([[], ["Started"], ["Started", "Completed"], ["Cancelled"]])
    again = st.booleans()
    return st.tuples(middle, end, again, middle).map(
        lambda t: (
            ["Scheduled", *t[0], *t[1]]
            + (["Scheduled", *t[3]] if t[2] and t[1] and t[1][-1] != "Started" else [])
        )
    )


def _build(plan: list[str]) -> Lifecycle:
    life = Lifecycle()
    not_befores = iter(f"Sun, 22 Nov 2026 0{2 + i % 7}:00:00 GMT" for i in range(100))
    for step in plan:
        if step == "Updated":
            life.transition("Updated", NotBefore=next(not_befores))
        elif step == "Held":
            life.held()
        elif step == "Prepared":
            life.prepared()
        elif step == "Approved":
            life.approved()
        elif step == "Completed":
            life.transition("Completed", impact={"measuredSeconds": 3, "method": "freeze-pause"})
        else:
            life.transition(step)
    return life


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=_lifecycle_plans(), data=st.data())
def test_any_order_of_arrival_yields_the_same_summary(plan: list[str], data: st.DataObject) -> None:
    life = _build(plan)
    in_order = MemoryHistoryStore()
    for message in life.messages:
        _history(in_order).record(_parsed(message), NOW)
    arrivals = data.draw(st.permutations(life.messages))
    duplicates = data.draw(st.lists(st.sampled_from(life.messages), max_size=4))
    shuffled = MemoryHistoryStore()
    for message in [*arrivals, *duplicates]:
        _history(shuffled).record(_parsed(message), NOW)
    key = scope_key()
    expected, got = stored(in_order, key), stored(shuffled, key)
    assert got == expected
    assert expected is not None
    appearances = 2 if plan.count("Scheduled") == 2 else 1
    assert len(expected.appearances) == appearances
    first_end = next((s for s in plan if s in ("Completed", "Cancelled", "Started")), "Scheduled")
    if appearances == 1:
        ended = "Completed" if "Completed" in plan else first_end
        assert expected.latest.state == ended
        assert expected.latest.updates == plan.count("Updated")


def test_two_writers_racing_lose_no_entry() -> None:
    """The summary is read before the entries and written under its ETag: whichever writer
    loses the race reads again, so the stored summary knows every entry."""
    store = MemoryHistoryStore()
    history = _history(store)
    life = full_life()
    for _ in range(5):
        store.rows.clear()
        store.stored.clear()
        errors = at_once(*(lambda m=m: history.record(_parsed(m), NOW) for m in life.messages))
        assert errors == [] or all(isinstance(e, SummaryConflict) for e in errors)
        for message in life.messages:  # what Service Bus would redeliver after a conflict
            history.record(_parsed(message), NOW)
        kept = stored(store)
        assert kept == summarize(store.entries(scope_key()).entries)
        assert kept is not None and kept.entries == 7


def test_retention_deletes_old_events_bounded_per_run() -> None:
    store = MemoryHistoryStore()
    for n in range(5):
        life = Lifecycle(event_id=f"00000000-0000-4000-8000-00000000000{n}")
        life.transition("Scheduled")
        _history(store).record(_parsed(life.messages[0]), NOW)
    schedule = PurgeSchedule()
    history = History(store, timedelta(days=1), schedule, purge_batch=2)
    later = NOW + timedelta(days=3)
    assert history.purge(later) == 2
    assert history.purge(later + timedelta(minutes=1)) == 0  # once per interval per process
    assert history.purge(later + timedelta(minutes=11)) == 2
    assert len(store.stored) == 1
    fresh = History(store, timedelta(days=90), PurgeSchedule())
    assert fresh.purge(later + timedelta(hours=1)) == 0


def test_a_failing_purge_never_fails_the_message() -> None:
    class Broken(MemoryHistoryStore):
        def expired(self, before, limit):  # type: ignore[no-untyped-def]
            raise OSError("table unreachable")

    store = Broken()
    life = Lifecycle()
    life.transition("Scheduled")
    outcome = _history(store).record(_parsed(life.messages[0]), NOW)
    assert outcome.written and outcome.purged == 0


@pytest.mark.parametrize(
    ("params", "problem"),
    [
        ({"state": "Exploded"}, "state must be"),
        ({"vm": "web/../x"}, "vm is not"),
        ({"resourceGroup": "rg'or'1"}, "resourceGroup is not"),
        ({"from": "yesterday"}, "from is not"),
        ({"limit": "100000"}, "limit must be"),
        ({"limit": "ten"}, "limit is not"),
        ({"$filter": "x"}, "unknown filter"),
    ],
)
def test_a_bad_filter_is_refused(params: dict[str, str], problem: str) -> None:
    with pytest.raises(QueryError, match=problem):
        parse_query(params)


def test_filters_select_events() -> None:
    store = MemoryHistoryStore()
    lives = []
    for n, (vm, end) in enumerate([("web-1", "Completed"), ("web-2", None), ("web-3", None)]):
        life = Lifecycle(event_id=f"00000000-0000-4000-8000-00000000001{n}")
        life.transition("Scheduled", Resources=[vm], DurationInSeconds=60 * (n + 1))
        if end:
            life.transition("Started")
            life.transition("Completed", impact={"measuredSeconds": 30, "method": "reboot-gap"})
        for message in life.messages:
            _history(store).record(_parsed(message), NOW)
        lives.append(life)
    everything = store.latest(parse_query({})).summaries
    assert len(select(everything, parse_query({}))) == 3
    assert [s.vms for s in select(everything, parse_query({"vm": "WEB-2"}))] == [("web-2",)]
    assert len(select(everything, parse_query({"state": "scheduled"}))) == 2
    assert len(select(everything, parse_query({"limit": "1"}))) == 1
    assert select(everything, parse_query({"resourceGroup": "rg-other"})) == []
    late = parse_query({"from": "2027-01-01T00:00:00Z"})
    assert select(everything, late) == []
    by_type = impact_by_type(everything)
    assert by_type["Reboot"]["events"] == 3 and by_type["Reboot"]["measured"] == 1
    assert by_type["Reboot"]["measuredSecondsAvg"] == 30.0
    assert by_type["Reboot"]["announcedSecondsAvg"] == 120.0


def test_recording_an_action_never_fails_the_workflow(caplog: pytest.LogCaptureFixture) -> None:
    from datetime import UTC, datetime

    from functions.history.core import StoreRecorder

    class Down(MemoryHistoryStore):
        def add(self, entries):  # type: ignore[no-untyped-def]
            raise OSError("table unreachable")

    life = Lifecycle()
    life.transition("Scheduled")
    life.transition("Cancelled")
    cancelled = _parsed(life.messages[-1])
    StoreRecorder(_history(Down()), "lb-pools").record(
        cancelled, "Restored", datetime.now(UTC), {"nics": 1}
    )
    assert "Restored of" in caplog.text and "not recorded" in caplog.text
    store = MemoryHistoryStore()
    recorder = StoreRecorder(_history(store), "lb-pools")
    for _ in range(2):  # the same cause, the same row
        recorder.record(cancelled, "Restored", NOW, {"nics": 1})
    (row,) = [e for e in store.entries(scope_key()).entries if e.name == "Restored"]
    assert row.source == "lb-pools" and row.details == {"nics": 1}
