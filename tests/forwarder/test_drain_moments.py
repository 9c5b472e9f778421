"""Issue 24, VM side: the prepare hooks and the drain probe act at each event's drain moment.

Everything runs in-process on a clock the test moves (no sleeping): the real local actions,
hooks worker (with a recording runner: a hook's effect outlives a crash), drain probe and
journal. A restart builds them again from the journal alone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sebridge.contract.events import Envelope
from sebridge.forwarder.local.actions import LocalActions
from sebridge.forwarder.local.drain_probe import DrainProbe
from sebridge.forwarder.local.hooks_file import parse_hooks
from sebridge.forwarder.local.journal import MEMORY, Journal
from sebridge.forwarder.local.preparation import Preparations
from sebridge.forwarder.local.runner import HookResult, Invocation, Outcome
from sebridge.forwarder.local.store import LocalStore
from sebridge.forwarder.local.worker import HookWorker
from sebridge.forwarder.state import ForwarderState
from sebridge.imds import ScheduledEvent
from sebridge.impact import DEFAULT_RULES
from sebridge.timing import (
    DEFAULT_LEADS,
    DEFAULT_PROBE_MIN_HEALTHY_SECONDS,
    RECENT_SECONDS,
    Leads,
    parse_leads,
)
from tests.forwarder.local_support import OBSERVER, Recorder, document, imds_event
from tests.support.budget import examples
from tests.support.forwarder_fakes import FakeClock

pytestmark = pytest.mark.timeout(300)

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
A = "aaaaaaaa-0000-4000-8000-000000000001"
B = "bbbbbbbb-0000-4000-8000-000000000002"
BOUND = 510  # the default --drain-probe-max-unhealthy-seconds
HOOKS = parse_hooks(
    {
        "hooks": [
            {"name": "prep", "on": ["Scheduled", "Updated"], "command": ["/x"], "prepare": True},
            {"name": "note", "on": ["Scheduled", "Updated", "Started"], "command": ["/x"]},
        ]
    }
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def rfc1123(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def reboot(event_id: str = A, *, not_before_in: float, **fields: Any) -> ScheduledEvent:
    """A Reboot of this VM whose NotBefore is ``not_before_in`` seconds after T0."""
    return imds_event(event_id, not_before=rfc1123(at(not_before_in)), **fields)


class Outside:
    """What outlives the process: the clock, the journal, what the hooks did."""

    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.journal = Journal(MEMORY)
        self.ran: list[tuple[str, str, datetime]] = []  # (message id, hook, when)
        self.outbox = Recorder()

    def runner(self, invocation: Invocation, **_: Any) -> HookResult:
        self.ran.append((invocation.message_id, invocation.hook.name, self.clock.now()))
        return HookResult(Outcome.SUCCEEDED, 0, 0.0, detail="exit code 0")

    def runs(self, hook: str = "prep") -> list[tuple[str, datetime]]:
        return [(message_id, when) for message_id, name, when in self.ran if name == hook]


class Forwarder:
    """The local actions as build_local_actions composes them, on the outside's journal."""

    def __init__(
        self,
        outside: Outside,
        leads: Leads = DEFAULT_LEADS,
        fallback: ForwarderState | None = None,
    ) -> None:
        self.outside = outside
        clock = outside.clock
        self.store = LocalStore(outside.journal)
        self.preparations = Preparations(self.store, outside.outbox, now=clock.now)
        self.hooks = HookWorker(
            HOOKS, self.store, self.preparations, runner=outside.runner, now=clock.now
        )
        self.probe = DrainProbe(
            DEFAULT_RULES,
            30,
            preparations=self.preparations,
            max_unhealthy=BOUND,
            now=clock.now,
            monotonic=clock.monotonic,
        )
        self.preparations.preparers = [self.hooks, self.probe]
        self.actions = LocalActions(
            self.store, self.preparations, self.hooks, self.probe, leads=leads, now=clock.now
        )
        self.actions.start(fallback=fallback)
        self.tick()

    def poll(self, *events: ScheduledEvent) -> None:
        """A poll that reads ``events``, then what the threads do."""
        self.actions.document_observed(document(*events), OBSERVER, self.outside.clock.now())
        self.tick()

    def tick(self) -> None:
        """The moments worker, the hooks worker and the drain timer, once."""
        self.actions.fire_due()
        self.hooks.drain()
        self.preparations.check_all()

    def later(self, seconds: float, *events: ScheduledEvent) -> None:
        """``seconds`` pass, IMDS still showing ``events``, polled once a second."""
        for _ in range(int(seconds)):
            self.outside.clock.advance(1)
            self.poll(*events)

    @property
    def status(self) -> int:
        return 503 if self.probe.draining else 200

    def prepared(self) -> list[str]:
        return [e.message_id for e in self.outside.outbox.envelopes if e.subject == "Prepared"]


# -- the examples of the issue -------------------------------------------------------------------
def test_a_long_notice_drains_and_prepares_at_notbefore_minus_the_lead() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(not_before_in=900)  # 15 minutes: the moment is at 600 s
    vm.poll(event)
    assert vm.status == 200 and outside.runs() == []
    assert [name for _, name, _ in outside.ran] == ["note"]  # other hooks: on the transition
    vm.later(599, event)
    assert vm.status == 200 and outside.runs() == [] and vm.prepared() == []
    vm.later(1, event)
    assert vm.status == 503
    assert outside.runs() == [(f"{A}:Scheduled:1", at(600))]
    vm.later(29, event)
    assert vm.prepared() == []  # the probe's drain takes --drain-seconds (30)
    vm.later(1, event)
    assert len(vm.prepared()) == 1


def test_a_short_notice_acts_at_first_sight() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(not_before_in=120))  # shorter than the 300 s lead
    assert vm.status == 503 and outside.runs() == [(f"{A}:Scheduled:1", T0)]
    # The prepare hook runs before the other hooks of the transition, as without a lead.
    assert [name for _, name, _ in outside.ran] == ["prep", "note"]


@pytest.mark.parametrize("kind", ["Preempt", "Terminate"])
def test_preempt_and_terminate_act_at_first_sight(kind: str) -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(not_before_in=300, event_type=kind))
    assert vm.status == 503 and outside.runs() == [(f"{A}:Scheduled:1", T0)]


def test_a_first_sight_drain_longer_than_the_bound_waits_for_notbefore_minus_the_bound() -> None:
    """A Terminate with 15 minutes of notice: the hooks at first sight, the probe's 503 for
    the last 510 s before NotBefore rather than the first 510 s after first sight."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=900, event_type="Terminate"))
    assert outside.runs() == [(f"{A}:Scheduled:1", T0)] and vm.status == 200
    vm.later(900 - BOUND - 1, event)
    assert vm.status == 200
    vm.later(1, event)
    assert vm.status == 503


def test_an_updated_notbefore_moves_a_pending_moment_both_ways() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(not_before_in=900))  # moment 600
    vm.later(100, later := reboot(not_before_in=1500))  # moment 1200
    vm.later(1000, later)
    assert outside.runs() == [] and vm.status == 200
    sooner = reboot(not_before_in=1300)  # moment 1000: it has come
    vm.later(1, sooner)
    (run,) = outside.runs()
    assert run[0].startswith(f"{A}:Updated:1:") and run[1] == at(1101)  # the Updated's hooks
    assert vm.status == 503


def test_a_moment_that_passed_is_not_undone_by_a_later_notbefore() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(first := reboot(not_before_in=900))
    vm.later(600, first)
    assert vm.status == 503 and len(outside.runs()) == 1
    postponed = reboot(not_before_in=4 * 3600)
    vm.later(1, postponed)
    assert vm.status == 503  # still drained
    (_, (updated, when)) = outside.runs()
    assert updated.startswith(f"{A}:Updated:1:") and when == at(601)  # at once: prepared again
    vm.later(40, postponed)
    assert len(vm.prepared()) == 1  # for the Updated: it came before the drain was done


def test_a_moment_that_came_before_the_next_revision_prepares_its_own_revision() -> None:
    """The process stood still past a moment (a frozen VM, a suspended forwarder: the moments
    worker did not tick), and the first document after it brings the next revision: the
    revision that was current when the moment came has its prepare hooks run, before the
    document's transition, and the next revision's run at once too (its moment has passed).
    Before, the new revision took the moment over and the prepare hooks of the revision the
    balancer was drained for never ran."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(not_before_in=900))  # moment 600
    outside.clock.advance(700)
    vm.poll(reboot(not_before_in=1800))  # no tick in between: the document comes first
    runs = outside.runs()
    assert [message_id for message_id, _ in runs][:1] == [f"{A}:Scheduled:1"]
    assert len(runs) == 2 and runs[1][0].startswith(f"{A}:Updated:1:")
    assert vm.status == 503  # drained since the moment, not undone by the later NotBefore


def test_cancelled_removes_the_moment() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=900))
    vm.later(300, event)
    vm.later(3600)  # gone: Cancelled
    assert outside.runs() == [] and vm.status == 200 and vm.prepared() == []
    assert vm.store.view.timing == {}


def test_a_restart_loses_no_pending_moment_and_fires_none_twice() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=900))
    vm.later(300, event)
    vm = Forwarder(outside)  # kill -9 and start again from the journal
    assert vm.status == 200  # from the journal: the moment is still to come
    vm.later(299, event)
    assert outside.runs() == []
    vm.later(1, event)
    assert outside.runs() == [(f"{A}:Scheduled:1", at(600))]
    vm = Forwarder(outside)  # again, after the moment
    vm.later(60, event)
    assert len(outside.runs()) == 1 and vm.status == 503


def test_a_moment_that_came_while_the_forwarder_was_down_fires_at_the_start() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=900))
    outside.clock.advance(700)  # down from 0 to 700 s
    vm = Forwarder(outside)  # before the first poll
    assert outside.runs() == [(f"{A}:Scheduled:1", at(700))]
    assert vm.status == 503
    vm.poll(event)
    assert len(outside.runs()) == 1


def test_the_first_sight_time_is_durable() -> None:
    """A Reboot seen 2 minutes before NotBefore is due at first sight; a restart does not make
    its first sight later (the probe's run keeps its start, so its bound too)."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=120))
    vm.later(60, event)
    vm = Forwarder(outside)
    timing = vm.store.view.timing[A]
    assert timing.first_seen == T0 and timing.fired == T0 and timing.probe_from == T0


# -- the probe's bound ---------------------------------------------------------------------------
def test_a_long_lead_spends_the_bound_just_before_notbefore_and_started_drains_regardless() -> None:
    outside = Outside()
    vm = Forwarder(outside, leads=parse_leads("Reboot=1800"))  # 30 minutes ahead
    vm.poll(event := reboot(not_before_in=3600))
    vm.later(1800, event)
    assert len(outside.runs()) == 1  # the hooks at the moment (NotBefore - 1800 s)...
    assert vm.status == 200  # ...the probe only from NotBefore - the bound
    vm.later(3600 - BOUND - 1800 - 1, event)
    assert vm.status == 200
    vm.later(1, event)
    assert vm.status == 503
    assert vm.probe.preparation_status(A) == "pending"
    vm.later(30, event)
    assert len(vm.prepared()) == 1  # hooks done and the probe drained
    vm.later(BOUND - 31, event)
    assert vm.status == 503  # at NotBefore, 1 s short of the bound
    vm.later(1, event)
    assert vm.status == 200  # Azure is late: healthy again rather than repaired
    assert vm.probe.preparation_status(A) == "pending"
    vm.later(600, event)
    assert vm.status == 200
    vm.later(1, started := reboot(not_before_in=3600, status="Started"))
    assert vm.status == 503
    vm.later(3600, started)
    assert vm.status == 503  # however long it runs


def test_the_bound_holds_across_a_restart() -> None:
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(event := reboot(not_before_in=60))  # first sight: the probe at 503 from T0
    vm.later(400, event)
    assert vm.status == 503
    outside.clock.advance(100)  # down for 100 s
    vm = Forwarder(outside)
    assert vm.status == 503  # 500 s into the run
    vm.later(10, event)
    assert vm.status == 200  # the run began at T0, not at the restart


# -- any sequence --------------------------------------------------------------------------------
LEAD = {"Reboot": 300, "Freeze": 120}  # the defaults the model knows; others: first sight


class MomentsModel(RuleBasedStateMachine):
    """Any sequence of documents (long and short notices, NotBefore moved both ways, started,
    cancelled), clock moves and restarts. An independent model of the rule: an event's moment
    has come once, at a poll or a tick, ``NotBefore - lead <= now`` for its current content (or
    it is a first-sight type, has no NotBefore, or started); it stays come for that appearance.

    Invariants: a prepare hook never runs before its event's moment; after a tick every
    present, not-started event of this VM whose moment came has had the prepare hooks of its
    current cause run, and no hook ran twice for one transition; while the probe answers 503
    with no started event, a drain began within the last bound (of this VM's impactful events,
    at ``max(moment, NotBefore - bound)``, and never before the last of a healthy gap's worth
    of 200s read from the probe: an event back under its old EventId with a begin in the past
    starts its run then),
    and a started one always drains it."""

    def __init__(self) -> None:
        super().__init__()
        self.outside = Outside()
        self.vm = Forwarder(self.outside)
        self.events: dict[str, ScheduledEvent] = {}
        self.first_seen: dict[str, datetime] = {}  # per present event (this appearance)
        self.came: dict[str, datetime] = {}  # when its moment came (sticky)
        self.probe_from: dict[str, datetime] = {}  # when the probe's 503 for it began
        self.rerun_from: dict[str, datetime] = {}  # the earliest a fresh run may start for it
        # When each EventId first drained this VM (its probe_from may be older: an event that
        # named another VM and came back naming this one gets its first run then).
        self.applied_from: dict[str, datetime] = {}
        # The probe's latest readings of 200 in a row, first and last: once they span the
        # healthy gap (so no run of 503 goes on across them), the run of 503 that follows
        # began after the last of them (run_floor), whatever its drains' begin times say (an
        # event back under its EventId with a begin in the past, say). After a shorter
        # streak the run may go on: it keeps the floor it had.
        self.healthy_from: datetime | None = None
        self.healthy_at: datetime | None = None
        self.run_floor: datetime | None = None
        self.cause: dict[str, str] = {}  # its latest Scheduled/Updated id
        # Events left out of a document: (when, first seen, came, probe from).
        self.recent: dict[str, tuple[datetime, datetime, datetime | None, datetime | None]] = {}
        self.checked = 0

    def now(self) -> datetime:
        return self.outside.clock.now()

    def look(self) -> None:
        """What a poll or a tick finds: the moments that came, the probe's begins."""
        now = self.now()
        for key, event in self.events.items():
            if OBSERVER.vm_name in event.resources and DEFAULT_RULES.is_impactful(event):
                self.applied_from.setdefault(key, now)
            lead = LEAD.get(event.event_type)
            nb = event.not_before
            moment = (
                self.first_seen[key]
                if lead is None or nb is None
                else max(self.first_seen[key], nb - timedelta(seconds=lead))
            )
            if event.is_started or moment <= now:
                self.came.setdefault(key, min(moment, now))
            if key not in self.probe_from and not event.is_started:
                begins = self.came.get(key, moment)
                if nb is not None:
                    begins = max(begins, nb - timedelta(seconds=BOUND))
                if begins <= now:
                    self.probe_from[key] = begins

    def poll(self) -> None:
        now = self.now()
        for key in list(self.first_seen):
            if key not in self.events:
                # Left out: its timing is remembered for RECENT_SECONDS (by this process).
                self.recent[key] = (
                    now,
                    self.first_seen[key],
                    self.came.get(key),
                    self.probe_from.get(key),
                )
                for table in (
                    self.first_seen,
                    self.came,
                    self.probe_from,
                    self.cause,
                    self.rerun_from,
                ):
                    table.pop(key, None)
        for key in self.events:
            if key in self.first_seen:
                continue
            gone = self.recent.pop(key, None)
            if gone is not None and now - gone[0] <= timedelta(seconds=RECENT_SECONDS):
                _, self.first_seen[key], came, probe_from = gone
                if came is not None:
                    self.came[key] = came
                if probe_from is not None:
                    self.probe_from[key] = probe_from
                    if now - gone[0] > timedelta(seconds=DEFAULT_PROBE_MIN_HEALTHY_SECONDS):
                        # Back after the balancer saw the probe healthy for the whole gap: a
                        # run cut short starts afresh, from its return.
                        self.rerun_from[key] = now
            else:
                self.first_seen[key] = now
        derived = self.vm.actions.document_observed(document(*self.events.values()), OBSERVER, now)
        for item in derived:
            if item.transition.value in ("Scheduled", "Updated"):
                self.cause[item.event.key] = item.message_id
        self.look()
        self.vm.tick()

    @rule(
        event_id=st.sampled_from([A, B]),
        kind=st.sampled_from(["Reboot", "Freeze", "Preempt"]),
        notice=st.sampled_from([20, 200, 400, 900, 3600, 3 * 86_400]),
        mine=st.booleans(),
    )
    def schedule(self, event_id: str, kind: str, notice: int, mine: bool) -> None:
        if event_id.lower() in self.events:
            return
        self.events[event_id.lower()] = imds_event(
            event_id,
            event_type=kind,
            not_before=rfc1123(self.now() + timedelta(seconds=notice)),
            resources=[OBSERVER.vm_name] if mine else ["web-9"],
        )
        self.poll()

    @rule(event_id=st.sampled_from([A, B]), shift=st.sampled_from([-600, -60, 60, 600, 7200]))
    def move(self, event_id: str, shift: int) -> None:
        event = self.events.get(event_id.lower())
        if event is None or event.is_started or event.not_before is None:
            return
        raw = event.to_imds() | {"NotBefore": rfc1123(event.not_before + timedelta(seconds=shift))}
        self.events[event.key] = ScheduledEvent.from_imds(raw, strict=False)
        self.poll()

    @rule(event_id=st.sampled_from([A, B]))
    def start(self, event_id: str) -> None:
        event = self.events.get(event_id.lower())
        if event is None or event.is_started:
            return
        raw = event.to_imds() | {"EventStatus": "Started", "NotBefore": ""}
        self.events[event.key] = ScheduledEvent.from_imds(raw, strict=False)
        self.poll()

    @rule(event_id=st.sampled_from([A, B]))
    def vanish(self, event_id: str) -> None:
        if self.events.pop(event_id.lower(), None) is not None:
            self.poll()

    @rule(seconds=st.sampled_from([1, 29, 120, 299, 600, 3600]))
    def time_passes(self, seconds: int) -> None:
        self.outside.clock.advance(seconds)
        self.look()
        self.vm.tick()

    @rule()
    def poll_again(self) -> None:
        self.poll()

    @precondition(lambda self: True)
    @rule()
    def restart(self) -> None:
        """kill -9 (every write reached the journal: its failures are another test's). The
        memory of events left out is journaled with the view: the model keeps it too."""
        self.vm = Forwarder(self.outside)
        self.look()

    @invariant()
    def no_prepare_hook_before_its_moment_and_none_twice(self) -> None:
        for message_id, hook, when in self.outside.ran[self.checked :]:
            if hook == "prep":
                key = message_id.split(":")[0]
                came = self.came.get(key)
                assert came is not None and came <= when, (message_id, when, came)
        self.checked = len(self.outside.ran)
        runs = [(message_id, hook) for message_id, hook, _ in self.outside.ran]
        assert len(runs) == len(set(runs)), runs

    @invariant()
    def every_moment_that_came_prepared_its_current_cause(self) -> None:
        ran = {message_id for message_id, hook, _ in self.outside.ran if hook == "prep"}
        for key, event in self.events.items():
            mine = OBSERVER.vm_name in event.resources
            if mine and not event.is_started and key in self.came and key in self.cause:
                assert self.cause[key] in ran, (key, self.cause[key])

    @invariant()
    def the_probe_drains_only_within_the_bound_unless_started(self) -> None:
        applies = {
            key: event
            for key, event in self.events.items()
            if OBSERVER.vm_name in event.resources and DEFAULT_RULES.is_impactful(event)
        }
        now = self.now()
        if any(event.is_started for event in applies.values()):
            assert self.vm.status == 503
            self.healthy_from = None
            return
        if self.vm.status == 200:
            self.healthy_from = self.healthy_from or now
            self.healthy_at = now
            return
        gap = timedelta(seconds=DEFAULT_PROBE_MIN_HEALTHY_SECONDS)
        if self.healthy_from is not None:  # the first 503 read after some 200s
            assert self.healthy_at is not None
            if self.healthy_at - self.healthy_from >= gap:
                self.run_floor = self.healthy_at
            self.healthy_from = None
        floor = self.run_floor
        recent = [
            key
            for key in applies
            if key in self.probe_from
            and now - timedelta(seconds=BOUND)
            < max(
                self.probe_from[key],
                self.rerun_from.get(key, self.probe_from[key]),
                self.applied_from.get(key, self.probe_from[key]),
                floor or self.probe_from[key],
            )
            <= now
        ]
        assert recent, (now, self.probe_from, floor)


MomentsModel.TestCase.settings = settings(
    max_examples=examples(150),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_moments_model = MomentsModel.TestCase


class Refusing(Recorder):
    """An outbox that refuses the first ``count`` Prepared it is handed, then takes them."""

    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count

    def __call__(self, envelope: Envelope) -> bool:
        if self.refused < self.count:
            self.refused += 1
            return False
        return super().__call__(envelope)


@pytest.mark.parametrize("refusals", [1, 5])
def test_a_prepared_the_outbox_refuses_once_is_no_error(
    refusals: int, caplog: pytest.LogCaptureFixture
) -> None:
    """The first refusal is the usual one (the poll that made Prepared due records its own
    transitions first): said at INFO, and the next try takes it. Refused again, the outbox
    cannot take it: one ERROR, however many tries (the hostile review h55 saw an ERROR at
    nearly every Prepared of the real forwarder)."""
    outside = Outside()
    outside.outbox = Refusing(refusals)
    vm = Forwarder(outside)
    event = reboot(not_before_in=120)  # drains at first sight
    vm.later(40, event)
    assert len(vm.prepared()) == 1 and outside.outbox.refused == refusals
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "Prepared" in r.message]
    assert len(errors) == (0 if refusals == 1 else 1), [r.message for r in errors]
