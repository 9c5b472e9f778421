"""Hypothesis state machine (issue 22e, item 1): this VM's identity resolves at any moment of
any history of documents, with restarts in between. The local actions that judged by the host
name until then end, after one more document, with the same hook runs as those that knew the
identity from the start (hooks of every phase, this VM's own, the neighbours' and the prepare
hooks at their drain moment), every run that waits carries the identity, and none waits in a
neighbour's lane for an event of this VM.

Two in-process local actions see the same documents: ``known`` by the identity from the start,
``late`` by the host name until the ``resolve`` rule. The hook workers are not started: what is
compared is what was recorded and queued. Before the fix, the re-judging observed only each
present event's latest transition: runs of earlier phases (a Scheduled hook of an event judged
while Started) and of events that ended meanwhile were missing."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sebridge.contract.events import Observer
from sebridge.forwarder.local.hooks_file import parse_hooks
from sebridge.forwarder.local.store import Unjudged
from sebridge.imds import ScheduledEvent
from tests.forwarder.local_support import OBSERVER, VM, Parts, document, imds_event
from tests.support.budget import examples

EVENTS = [f"{c * 8}-0000-4000-8000-00000000000{i}" for i, c in enumerate("abc")]
HOST = Observer(vm_name="host-1")  # the fallback: no vmId, no resource id
START = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
ALL = ["Scheduled", "Updated", "Started", "Completed", "Cancelled"]


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


HOOKS = parse_hooks(
    {
        "hooks": [
            {"name": "own", "on": ALL, "command": ["/bin/true"]},
            {"name": "every", "on": ALL, "allEvents": True, "command": ["/bin/true"]},
            {
                "name": "prep",
                "on": ["Scheduled", "Updated"],
                "prepare": True,
                "command": ["/bin/true"],
            },
        ]
    }
)


class Rejudging(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.base = Path(tempfile.mkdtemp(prefix="rejudge-sm-"))
        (self.base / "known").mkdir()
        (self.base / "late").mkdir()
        self.known = Parts(self.base / "known", HOOKS)
        self.late = Parts(self.base / "late", HOOKS)
        self.late_observer = HOST
        self.events: dict[str, ScheduledEvent] = {}
        self.now = START
        self.judged_since_resolved = False

    def teardown(self) -> None:
        self.known.journal.close()
        self.late.journal.close()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- the documents ------------------------------------------------------------------------
    @rule(
        event=st.sampled_from(EVENTS),
        mine=st.booleans(),
        notice=st.sampled_from([-3600, 60, 86400]),
    )
    def schedule(self, event: str, mine: bool, notice: int) -> None:
        if event not in self.events:
            self.events[event] = imds_event(
                event,
                resources=[VM] if mine else ["neighbour"],
                not_before=rfc1123(self.now + timedelta(seconds=notice)),
            )

    @rule(event=st.sampled_from(EVENTS), notice=st.sampled_from([-600, 120, 7200]))
    def update(self, event: str, notice: int) -> None:
        old = self.events.get(event)
        if old is not None and not old.is_started:
            self.events[event] = imds_event(
                event,
                resources=old.resources,
                not_before=rfc1123(self.now + timedelta(seconds=notice)),
            )

    @rule(event=st.sampled_from(EVENTS))
    def start(self, event: str) -> None:
        old = self.events.get(event)
        if old is not None:
            self.events[event] = imds_event(event, resources=old.resources, status="Started")

    @rule(event=st.sampled_from(EVENTS))
    def vanish(self, event: str) -> None:
        self.events.pop(event, None)

    @rule(seconds=st.sampled_from([1, 90, 400]))
    def observe(self, seconds: int) -> None:
        self.now += timedelta(seconds=seconds)
        doc = document(*self.events.values())
        self.known.actions.document_observed(doc, OBSERVER, self.now)
        self.late.actions.document_observed(doc, self.late_observer, self.now)
        self.judged_since_resolved = self.late_observer == OBSERVER

    # -- the identity and restarts --------------------------------------------------------
    @rule()
    def resolve(self) -> None:
        self.late_observer = OBSERVER

    @rule()
    def restart_late(self) -> None:
        """The late forwarder stops and starts (its journal holds what it judged)."""
        self.late.journal.close()
        self.late = Parts(self.base / "late", HOOKS)
        assert self.late.worker is not None
        self.late.worker.resume()

    # -- the promise ----------------------------------------------------------------------
    @invariant()
    def same_runs_once_judged_by_the_identity(self) -> None:
        if not self.judged_since_resolved:
            return
        assert set(self.late.store.runs) == set(self.known.store.runs)
        for run in self.late.store.unfinished():
            assert run.payload["observer"]["vmName"] == VM, run.key
        worker = self.late.worker
        assert worker is not None
        for lane, queue in worker._queues.items():
            for job in queue:
                assert job.observed.observer == OBSERVER, job.run.key
                assert lane == (job.run.event_key, job.own), job.run.key
        assert self.late.store.view.unjudged == ()


Rejudging.TestCase.settings = settings(
    max_examples=examples(60),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestRejudging = pytest.mark.timeout(300)(Rejudging.TestCase)


def test_an_earlier_revision_whose_moment_had_not_come_gets_no_prepare_run() -> None:
    """Found by the machine above (a make coverage run, 2026-11-27): Scheduled with a day's
    notice, then Updated to a NotBefore already past, then the identity resolves. The VM that
    knew its identity ran the prepare hook once, for the Updated revision (the Scheduled one's
    moment never came while it was current); the late one re-judged the Scheduled revision
    with the event's present timing, found its moment past and queued a second prepare run.
    Each transition judged by the host name now keeps when it was observed and its moment
    then, and the re-judging replays whether the moment came before the next transition."""
    machine = Rejudging()
    try:
        event = EVENTS[0]
        machine.schedule(event=event, mine=True, notice=86400)
        machine.observe(seconds=1)
        machine.update(event=event, notice=-600)
        machine.observe(seconds=1)
        machine.resolve()
        machine.observe(seconds=1)
        prepared = {key for key, hook in machine.late.store.runs if hook == "prep"}
        known = {key for key, hook in machine.known.store.runs if hook == "prep"}
        assert len(known) == 1
        assert prepared == known
    finally:
        machine.teardown()


def test_a_transition_kept_for_the_rejudging_keeps_its_times_through_the_journal() -> None:
    """What the re-judging replays survives a restart; a record from before the times were
    kept, or with a damaged one, reads without it (judged as the latest revision is)."""
    machine = Rejudging()
    try:
        machine.schedule(event=EVENTS[0], mine=True, notice=86400)
        machine.observe(seconds=1)
        machine.restart_late()
        (kept,) = machine.late.store.view.unjudged
        assert kept.at == START + timedelta(seconds=1)
        assert kept.moment is not None and kept.moment > kept.at  # a day's notice: to come
        raw = kept.to_json()
        assert Unjudged.from_json(raw) == kept
        older = {key: value for key, value in raw.items() if key not in ("at", "moment")}
        assert Unjudged.from_json(older) == replace(kept, at=None, moment=None)
        damaged = {**raw, "at": "yesterday", "moment": 12}
        assert Unjudged.from_json(damaged) == replace(kept, at=None, moment=None)
    finally:
        machine.teardown()
