"""history: measured impact of an event that names a set of VMs (issue 26).

The topic keeps one Completed of a set (every VM's has the event's id), so each VM reports its
measurement in a Measured of its own; the history shows announced against measured per VM and
the per-type summary counts every VM's figure. Attacked: any order of arrival, redelivery, a
Completed that carries another VM's figure, a report from a VM the event does not name, a
stored summary read back.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from functions.history.core import (
    History,
    PurgeSchedule,
    entry_for,
    impact_by_type,
    summarize,
    summary_from_properties,
    summary_properties,
    timeline_json,
)
from tests.functions.history_support import T0, Lifecycle, MemoryHistoryStore, stored, verified
from tests.support.budget import examples

NOW = T0 + timedelta(hours=1)
SET = ("web-1", "web-2", "web-3")


def set_life() -> Lifecycle:
    """A Freeze of three VMs: the Completed the topic kept is web-1's, without a figure (its
    forwarder measured nothing), and each VM's Measured."""
    life = Lifecycle()
    life.transition("Scheduled", EventType="Freeze", DurationInSeconds=9, Resources=list(SET))
    life.transition("Started")
    life.transition("Completed")
    life.measured("web-1", 2.5)
    life.measured("web-2", 11.0)
    life.measured("WEB-3", 0.0)  # the name as the VM spells it: one VM whatever the case
    return life


def _history(store: MemoryHistoryStore) -> History:
    return History(store, timedelta(days=90), PurgeSchedule())


def test_every_vm_of_the_set_has_its_measurement_in_the_history() -> None:
    store = MemoryHistoryStore()
    history = _history(store)
    for message in set_life().messages:
        history.record(verified(message), NOW)
    summary = stored(store)
    assert summary is not None
    impact = summary.to_json()["impact"]
    assert impact["vms"] == [
        {"vm": "web-1", "announcedSeconds": 9, "measuredSeconds": 2.5, "method": "freeze-pause"},
        {"vm": "web-2", "announcedSeconds": 9, "measuredSeconds": 11.0, "method": "freeze-pause"},
        {"vm": "web-3", "announcedSeconds": 9, "measuredSeconds": 0.0, "method": "freeze-pause"},
    ]
    # The event's figure is the largest any VM measured, not whichever Completed won.
    assert impact["measuredSeconds"] == 11.0 and impact["measured"] is True
    by_type = impact_by_type([summary])["Freeze"]
    assert by_type["measured"] == 3
    assert by_type["measuredSecondsAvg"] == round((2.5 + 11.0 + 0.0) / 3, 3)
    assert by_type["measuredSecondsMax"] == 11.0
    assert summary.latest.state == "Completed"  # a report is no transition
    # Reports are shown as such in the timeline, each with its VM.
    timeline = history.timeline(summary.event_key)[0]
    rows = [r for r in timeline_json(timeline)["timeline"] if r["name"] == "Measured"]
    assert {r["observer"].lower() for r in rows} == set(SET)
    assert {r["kind"] for r in rows} == {"report"}


def test_a_redelivered_measurement_writes_nothing() -> None:
    store = MemoryHistoryStore()
    history = _history(store)
    life = set_life()
    for message in life.messages:
        history.record(verified(message), NOW)
    writes = store.summary_writes
    for message in life.messages[-3:]:
        history.record(verified(message), NOW + timedelta(minutes=1))
    assert store.summary_writes == writes


@settings(max_examples=examples(60), deadline=None)
@given(st.permutations(range(6)))
def test_any_order_of_arrival_gives_the_same_measurements(order: list[int]) -> None:
    messages = set_life().messages
    entries = [e for i in order if (e := entry_for(verified(messages[i]), NOW))]
    summary = summarize(entries)
    assert summary is not None
    reference = summarize([e for m in messages if (e := entry_for(verified(m), NOW))])
    assert reference is not None
    assert summary.latest.measured_vms == reference.latest.measured_vms
    assert len(summary.latest.measured_vms) == 3


def test_a_completed_carrying_a_figure_counts_for_its_vm_once() -> None:
    """A forwarder of this version puts its figure on its Completed and in its Measured: the
    same VM's figure is counted once (and an older forwarder's Completed alone still counts)."""
    life = Lifecycle()
    life.transition("Scheduled", Resources=list(SET))
    life.transition("Started")
    life.transition("Completed", impact={"measuredSeconds": 40.0, "method": "reboot-gap"})
    life.measured("web-1", 40.0, "reboot-gap")  # the golden observer is web-1
    life.measured("web-2", 35.0, "reboot-gap")
    summary = summarize([e for m in life.messages if (e := entry_for(verified(m), NOW))])
    assert summary is not None
    assert [(m.vm, m.seconds) for m in summary.latest.measured_vms] == [
        ("web-1", 40.0),
        ("web-2", 35.0),
    ]
    assert impact_by_type([summary])["Reboot"]["measured"] == 2


def test_a_report_from_a_vm_the_event_does_not_name_is_not_shown() -> None:
    life = set_life()
    life.measured("db-9", 99.0)
    summary = summarize([e for m in life.messages if (e := entry_for(verified(m), NOW))])
    assert summary is not None
    assert "db-9" not in {m.vm for m in summary.latest.measured_vms}
    assert summary.latest.measured_seconds == 11.0


def test_the_stored_summary_reads_back_the_same_measurements() -> None:
    life = set_life()
    life.measured("web-2", 12.0, "some-future-method")
    summary = summarize([e for m in life.messages if (e := entry_for(verified(m), NOW))])
    assert summary is not None
    assert summary_from_properties(summary_properties(summary)) == summary
    # A summary stored before per-VM figures existed still reads.
    properties = summary_properties(summary)
    old = summary_from_properties(
        {
            **properties,
            "a00": properties["a00"]
            .replace('"measuredVms"', '"ignoredA"')
            .replace('"measureMethods"', '"ignoredB"'),
        }
    )
    assert old.latest.measured_vms == () and old.latest.measured_seconds == 12.0


def test_a_measurement_stands_after_the_end_it_measured_whenever_it_arrives() -> None:
    """The timeline by the event's life (history ordered by appearance and phase): a Measured
    is a report of the ended appearance, so it follows its Completed even when it arrives
    first (merging the Measured report with the life order first placed it before Started)."""
    store = MemoryHistoryStore()
    history = _history(store)
    messages = set_life().messages
    for message in reversed(messages):  # every report before the transitions it follows
        history.record(verified(message), NOW)
    summary = stored(store)
    assert summary is not None
    names = [r["name"] for r in timeline_json(history.timeline(summary.event_key)[0])["timeline"]]
    assert names == ["Scheduled", "Started", "Completed", "Measured", "Measured", "Measured"]
