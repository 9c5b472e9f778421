"""Issue 24 review, item 3: the drain probe as the load balancer and repairs see it.

In-process on a clock the test moves (wall and monotonic apart, so the wall clock can step),
with the real local actions, drain probe and journal (tests/forwarder/test_drain_moments.py's
harness). The load balancer is modelled as Azure's: it probes every 5 s and changes its view
after 2 answers in a row; automatic repairs watch that view.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sebridge.forwarder.local.journal import MEMORY, Journal
from sebridge.forwarder.state import ForwarderState
from sebridge.imds import ScheduledEvent
from sebridge.impact import DEFAULT_RULES
from sebridge.timing import DEFAULT_PROBE_MIN_HEALTHY_SECONDS, parse_leads
from tests.forwarder.local_support import OBSERVER, document, imds_event
from tests.forwarder.test_drain_moments import BOUND, T0, A, B, Forwarder, Outside, reboot
from tests.support.budget import examples

pytestmark = pytest.mark.timeout(300)

INTERVAL, THRESHOLD = 5, 2  # Azure Load Balancer's probe defaults
# What the balancer may show as unhealthy for one run of 503: the run and its lag.
LB_BOUND = BOUND + INTERVAL * THRESHOLD
DOWN_AT_MOST = 20  # seconds a restart takes in the model (kill -9, systemd's restart)


class Balancer:
    """Azure Load Balancer's view of the probe: sampled every INTERVAL seconds of real
    (monotonic) time at a phase, down after THRESHOLD 503s in a row, up after THRESHOLD 200s.
    ``stretch``: how long, in real seconds, its current view of "down" has lasted."""

    def __init__(self, phase: int = 0) -> None:
        self.phase = phase
        self.down = False
        self.row = 0  # answers in a row that disagree with the view
        self.down_since: float | None = None
        self.longest = 0.0

    def sample(self, mono: float, status: int, exempt: bool = False) -> None:
        """``exempt``: an event of this VM has started (the bound is for events that have
        not): the stretch starts again."""
        if int(mono) % INTERVAL != self.phase:
            return
        unhealthy = status == 503
        self.row = self.row + 1 if unhealthy != self.down else 0
        if self.row >= THRESHOLD:
            self.down, self.row = unhealthy, 0
            self.down_since = mono if unhealthy else None
        if exempt and self.down:
            self.down_since = mono
        if self.down and self.down_since is not None:
            self.longest = max(self.longest, mono - self.down_since)


def watch(vm: Forwarder, seconds: int, *events: ScheduledEvent) -> list[Balancer]:
    """``seconds`` pass polled every second; every phase of a balancer watches."""
    balancers = [Balancer(phase) for phase in range(INTERVAL)]
    for _ in range(seconds):
        vm.later(1, *events)
        for balancer in balancers:
            balancer.sample(vm.outside.clock.mono, vm.status)
    return balancers


def longest(balancers: list[Balancer]) -> float:
    return max(b.longest for b in balancers)


# -- the reviewer's cases --------------------------------------------------------------------------
def test_two_events_back_to_back_get_a_healthy_gap_the_balancer_sees() -> None:
    """Before: event A's run reached the bound at 600 and B's began at 601: the balancer saw
    1010 s of 503 (a single 200 between)."""
    vm = Forwarder(Outside(), leads=parse_leads("Reboot=600"))
    a, b = reboot(A, not_before_in=600), reboot(B, not_before_in=600 + 511)
    vm.poll(a, b)
    balancers = watch(vm, 1300, a, b)
    assert longest(balancers) <= LB_BOUND
    assert all(not b.down for b in balancers) or vm.status == 503


def test_an_event_left_out_of_one_document_keeps_its_run() -> None:
    """Before: the event came back as new: first seen again, a fresh run of 510 s from the
    flap: the balancer saw 720 s of 503, 210 s past NotBefore."""
    outside = Outside()
    vm = Forwarder(outside, leads=parse_leads("Reboot=600"))
    a = reboot(A, not_before_in=1500)
    vm.poll(a)
    balancers = [Balancer(phase) for phase in range(INTERVAL)]
    statuses = []
    for second in range(1, 2000):
        vm.later(1, *([] if second == 1200 else [a]))
        statuses.append(vm.status)
        for balancer in balancers:
            balancer.sample(outside.clock.mono, vm.status)
    assert longest(balancers) <= LB_BOUND
    assert statuses[989] == 503 and statuses[1500] == 200  # its one run ends at NotBefore
    timing = vm.store.view.timing[A.lower()]
    assert timing.first_seen == reboot(A, not_before_in=0).not_before  # T0: kept


def test_a_wall_clock_step_back_never_stretches_a_run() -> None:
    """Before: runs were measured on the wall clock: a step back of 300 s 410 s into a run gave
    810 real seconds of 503."""
    outside = Outside()
    vm = Forwarder(outside, leads=parse_leads("Reboot=600"))
    a = reboot(A, not_before_in=3000)
    vm.poll(a)
    streak = best = 0
    for second in range(1, 3400):
        outside.clock.advance(1)
        if second == 2900:
            outside.clock.wall -= timedelta(seconds=300)
        vm.poll(a)
        streak = streak + 1 if vm.status == 503 else 0
        best = max(best, streak)
    assert 0 < best <= BOUND


# -- restarts (hostile review of issue 24, round two) ----------------------------------------------
GAP = DEFAULT_PROBE_MIN_HEALTHY_SECONDS


def first(status: int, vm: Forwarder, seconds: int, *events: ScheduledEvent) -> int | None:
    """How many seconds from now the probe first answers ``status`` (None: not within
    ``seconds``), IMDS showing ``events``, polled once a second."""
    for second in range(1, seconds + 1):
        vm.later(1, *events)
        if vm.status == status:
            return second
    return None


def test_a_restart_just_after_a_started_event_ended_keeps_the_healthy_gap() -> None:
    """Before: S (started) drained, ended; the forwarder restarted 2 s later and forgot when
    the probe was last 503, so P's run began 20 s after S's 503 (the gap is 90 s)."""
    outside = Outside()
    vm = Forwarder(outside)
    started = reboot(A, not_before_in=0, status="Started")
    p = reboot(B, not_before_in=20 + 300 + 10)  # its drain moment (lead 300): 30 s from T0
    vm.poll(started, p)
    vm.later(10, started, p)
    assert vm.status == 503
    vm.later(1, p)  # S is over: 200 from here, for the gap at least
    ended = 11
    assert vm.status == 200
    vm.later(2, p)
    vm = Forwarder(outside)  # kill -9 and start again
    assert vm.status == 200
    came = first(503, vm, 200, p)
    assert came is not None
    assert ended + 2 + came >= ended + GAP  # seconds since S's last 503


def test_an_event_left_out_across_a_restart_keeps_its_timing_and_the_bound_holds() -> None:
    """Before: a run 400 s old, the event left out of two documents, a restart, the event back:
    it started afresh (first seen again) with a new run of the full bound at once, so the
    balancer saw one stretch of about 400 + 510 s."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=60)  # first sight: 503 from T0
    balancers = [Balancer(phase) for phase in range(INTERVAL)]

    def second(*shown: ScheduledEvent) -> None:
        vm.later(1, *shown)
        for balancer in balancers:
            balancer.sample(outside.clock.mono, vm.status)

    vm.poll(event)
    for _ in range(400):
        second(event)
    second()  # left out of two documents
    second()
    outside.clock.advance(3)  # down 3 s: the balancer sees the probe refused
    for balancer in balancers:
        balancer.sample(outside.clock.mono, 503)
    vm = Forwarder(outside)
    for _ in range(1200):
        second(event)
    timing = vm.store.view.timing[A.lower()]
    assert timing.first_seen == T0 and timing.probe_from == T0  # its timing, kept
    assert longest(balancers) <= LB_BOUND, [b.longest for b in balancers]


def test_a_spent_drain_left_out_across_a_restart_stays_healthy_until_it_starts() -> None:
    """Round three: a drain that spent its bound was left out of a document, the forwarder
    restarted, the event came back: the spent mark had lived only in memory, so it got a second
    full run (and a Prepared) that the same sequence without the restart never gives."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=60)  # first sight: 503 from T0; Azure is late
    vm.poll(event)
    vm.later(BOUND + 10, event)
    assert vm.status == 200  # spent
    prepared = vm.prepared()
    vm.later(2)  # left out of two documents
    outside.clock.advance(3)  # kill -9, down 3 s
    vm = Forwarder(outside)
    assert first(503, vm, 600, event) is None  # 200 until it starts
    assert vm.prepared() == prepared
    vm.later(1, reboot(A, not_before_in=60, status="Started"))
    assert vm.status == 503


def test_two_drains_spent_in_one_run_stay_spent_when_one_was_left_out_at_the_restart() -> None:
    """Round four: R and P spent their bound in one run; R was left out of the last document
    before a kill -9, P was not. The restart replayed P first and R after it, as if R had run
    on its own later: R got a second full run and a third Prepared."""
    outside = Outside()
    vm = Forwarder(outside)
    r, p = reboot(A, not_before_in=60), reboot(B, not_before_in=65)
    vm.poll(r)
    vm.later(5, r)
    vm.later(600, r, p)  # both in one run, spent at 510 s
    assert vm.status == 200
    prepared = vm.prepared()
    vm.later(1, p)  # R left out
    outside.clock.advance(3)  # kill -9, down 3 s
    vm = Forwarder(outside)
    assert first(503, vm, 700, r, p) is None  # 200 until they start
    assert vm.prepared() == prepared


def test_a_lost_journal_view_waits_the_gap_rather_than_guessing_when_a_run_began() -> None:
    """Round four: the journal's view was damaged during a run; the forwarder started again from
    its state file, whose last observation is not when the drain began, and held a fresh run:
    the balancer saw 503 for longer than the bound. Now nothing is replayed from a guess: the
    probe answers 200 for the whole healthy gap first."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=60)  # first sight: 503 from T0
    vm.poll(event)
    vm.later(500, event)
    assert vm.status == 503
    state = ForwarderState(events={event.key: event}, observed_at=outside.clock.now())
    outside.journal = Journal(MEMORY)  # the view is gone
    outside.clock.advance(3)
    vm = Forwarder(outside, fallback=state)
    came = first(503, vm, 700, event)
    assert came is not None and came >= GAP  # 200 for the gap: the runs stay apart


def test_an_event_back_after_the_gap_gets_a_whole_run_and_prepared_waits_for_it() -> None:
    """Round five: an event left out of the documents for longer than the gap came back with a
    run counted from the gap's end, in the past: 300 s away left it 300 s of 503, 590 s away
    10 s, and its drain counted as done (Prepared) the instant the 503 began."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=60)  # first sight: 503 from T0
    vm.poll(event)
    vm.later(5, event)
    vm.later(300)  # left out for 300 s
    vm.later(1, event)
    assert vm.status == 503
    assert vm.probe.preparation_status(A.lower()) == "pending"  # not drained yet: just began
    assert first(200, vm, BOUND - 2, event) is None  # a whole run


@pytest.mark.parametrize("away", [300, 520])
def test_an_event_back_after_the_gap_keeps_its_fresh_run_across_a_restart(away: int) -> None:
    """Round six: the fresh run of an event back after the gap was known only in memory; a
    restart replayed the old begin, so the run was cut short (away 300 s: 199 s of 503) or
    spent at once (away 520 s: none, and its Prepared never came)."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=60)  # first sight: 503 from T0
    vm.poll(event)
    vm.later(5, event)
    vm.later(away)  # left out
    vm.later(2, event)  # back: a fresh run
    assert vm.status == 503
    outside.clock.advance(3)  # kill -9, down 3 s
    vm = Forwarder(outside)
    assert vm.status == 503
    assert first(200, vm, BOUND - 20, event) is None  # the run goes on from the return
    assert any(
        message_id.endswith(":Prepared:2") or ":Prepared:2:" in message_id
        for message_id in vm.prepared()
    ), vm.prepared()


def test_a_restart_within_the_gap_starts_the_gap_again() -> None:
    """Round five: a kill -9 6 s into the gap after a run, down 5 s: the next run began when the
    gap counted from the run's end was over, so the balancer saw 5 s of 200, the refused
    probe, then 503 again."""
    outside = Outside()
    vm = Forwarder(outside)
    a = reboot(A, not_before_in=60)  # first sight: 503 from T0, spent at the bound
    vm.poll(a)
    vm.later(BOUND, a)
    assert vm.status == 200
    b = reboot(B, not_before_in=BOUND + 20)  # drains at first sight too
    vm.later(6, a, b)
    assert vm.status == 200  # within the gap
    outside.clock.advance(5)  # kill -9, down 5 s
    vm = Forwarder(outside)
    came = first(503, vm, 300, a, b)
    assert came is not None and came >= GAP  # the gap again, from the restart


def test_a_first_sight_drain_just_after_a_restart_drains_at_once_and_ends_sooner() -> None:
    """A restart (down 3 s: the balancer saw the probe refused), then, 10 s after the start, a
    Preempt: the probe answers 503 at once, as at first sight, and its run counts its bound
    from the start, so the balancer's stretch (the refusal, the 200s it may not have counted,
    the run) stays within the bound and its lag."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.later(300)
    outside.clock.advance(3)  # kill -9, down 3 s
    vm = Forwarder(outside)
    vm.later(10)
    preempt = reboot(A, not_before_in=300 + 3 + 10 + 30, event_type="Preempt")
    vm.later(1, preempt)
    assert vm.status == 503
    streak = 1 + (first(200, vm, BOUND, preempt) or BOUND) - 1
    assert streak == BOUND - 11  # counted from the start, 11 s before the run began


def test_restarts_in_a_row_longer_than_the_bound_never_put_a_drain_off() -> None:
    """A crash loop (up 4 s, down 5 s) for 10 minutes, then it stays up and a Preempt comes: a
    run counted from the loop's first start would have nothing left; the probe answers 503 at
    once all the same, for the whole bound (what the balancer sees of a crash loop is the
    loop's own doing: no process can help it)."""
    outside = Outside()
    vm = Forwarder(outside)
    for _ in range(600 // 9):
        vm.later(4)
        outside.clock.advance(5)  # kill -9, down 5 s
        vm = Forwarder(outside)
    vm.later(1)
    up = (outside.clock.now() - T0).total_seconds()
    preempt = reboot(A, not_before_in=up + 30, event_type="Preempt")
    assert first(503, vm, 5, preempt) == 1
    assert first(200, vm, BOUND, preempt) == BOUND  # a whole run (its first second above)


class Life:
    """One VM watched by every phase of a balancer, restarted by kill -9 (the balancer sees the
    probe refused while it is down). From the hostile review h50 of the rule above."""

    def __init__(self) -> None:
        self.outside = Outside()
        self.balancers = [Balancer(phase) for phase in range(INTERVAL)]
        self.vm = Forwarder(self.outside)

    def sample(self, status: int) -> None:
        for balancer in self.balancers:
            balancer.sample(self.outside.clock.mono, status)

    def up(self, seconds: int, *events: ScheduledEvent) -> None:
        for _ in range(seconds):
            self.outside.clock.advance(1)
            self.vm.poll(*events)
            self.sample(self.vm.status)

    def down(self, seconds: int, wall_step: int = 0) -> None:
        self.outside.clock.wall += timedelta(seconds=wall_step)
        for _ in range(seconds):
            self.outside.clock.advance(1)
            self.sample(503)
        self.vm = Forwarder(self.outside)

    def event(self, event_id: str, notice: int, **fields: object) -> ScheduledEvent:
        not_before = self.outside.clock.wall + timedelta(seconds=notice)
        return imds_event(event_id, not_before=not_before.strftime(GMT), **fields)

    def preempt(self, notice: int = 30) -> ScheduledEvent:
        return self.event(A, notice, event_type="Preempt")

    def neighbours(self, index: int) -> ScheduledEvent:
        return self.event(f"cccccccc-0000-4000-8000-00000000000{index}", 86400, resources=["x"])


GMT = "%a, %d %b %Y %H:%M:%S GMT"


def test_a_document_keeps_the_starts_in_the_view() -> None:
    """h50 F1: a document that changed the view rebuilt it field by field, without when the
    forwarder started: the next start saw no restarts in a row."""
    life = Life()
    life.up(1, life.neighbours(0))
    assert life.vm.store.view.started_at is not None
    written = life.outside.journal.load().view
    assert written is not None and written["startedAt"] and written["darkSince"]
    assert written["clock"]["boot"] and written["clock"]["mono"] == life.outside.clock.mono


@pytest.mark.parametrize(
    ("downs", "wall_step", "allowed"),
    [
        ([20, 20, 20, 20, 20], 0, 20),  # with documents that change the view (h50 F1)
        ([20, 20, 20, 20, 20], 300, 20),  # the wall clock steps between two starts (F2)
        ([20, 20, 20, 20, 20], -30, 20),
        ([20, 20, 20, 20, 100], 0, 100),  # a downtime longer than the gap (F3)
    ],
)
def test_restarts_in_a_row_then_a_preempt_keep_the_balancers_stretch(
    downs: list[int], wall_step: int, allowed: int
) -> None:
    """Healthy, then kill -9s with a few seconds up between (a neighbour's event new each
    time), then a Preempt: it drains at once, and no balancer sees a stretch longer than the
    bound, its lag and the longest downtime (before: 625 s, 550 s, 705 s)."""
    life = Life()
    life.up(120)
    for index, down in enumerate(downs):
        last = index == len(downs) - 1
        life.down(down, wall_step=wall_step if last else 0)
        life.up(5 if last else 6, life.neighbours(index))
    preempt = life.preempt()
    life.up(1, preempt)
    assert life.vm.status == 503  # at once
    life.up(800, preempt)
    assert longest(life.balancers) <= LB_BOUND + allowed


def test_restarts_a_while_apart_never_put_a_preempt_off() -> None:
    """h50 F4: up 80 s at a time (shorter than the gap), down 5 s, over and over: a Preempt
    with 30 s of notice drains at once (before: 85 s later, past NotBefore)."""
    life = Life()
    life.up(120)
    for _ in range(7):
        life.down(5)
        life.up(80)
    life.down(5)
    life.up(5)
    preempt = life.preempt(notice=30)
    life.up(1, preempt)
    assert life.vm.status == 503


def test_a_journal_with_starts_at_the_end_of_time_starts_all_the_same() -> None:
    """h50 F5: startedAt and darkSince near datetime.max made every start overflow."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(A, not_before_in=900))
    view = dict(outside.journal.load().view or {})
    view |= {
        "startedAt": "9999-12-31T23:59:30+00:00",
        "darkSince": "9999-12-31T23:59:00+00:00",
        "darkMono": 1e300,
        "boot": 7,
        "seenHealthy": "yesterday",
    }
    outside.journal.commit(view=view, runs=[], preparations=[])
    vm = Forwarder(outside)
    assert vm.store.view.started_at == outside.clock.now()
    vm.later(700, reboot(A, not_before_in=900))
    assert vm.status == 503  # its moment (600 s) came: the probe drains as ever


def test_a_drain_the_gap_held_back_waits_out_the_gap_across_a_restart() -> None:
    """Round h40: a started event's 503 ended at 11 s; another drain's moment came at 30 s and
    the gap held it back; a kill -9 at 60 s: the replay took the held drain for a run going on
    and answered 503 a second after the start (42 s after the 503 ended; the gap is 90 s)."""
    outside = Outside()
    vm = Forwarder(outside)
    started = reboot(A, not_before_in=0, status="Started")
    p = reboot(B, not_before_in=20 + 300 + 10)  # its drain moment (lead 300): 30 s from T0
    vm.poll(started, p)
    vm.later(10, started, p)
    vm.later(1, p)  # the started event is over: 200 from 11 s
    vm.later(49, p)
    assert vm.status == 200  # held back by the gap
    outside.clock.advance(3)  # kill -9, down 3 s
    vm = Forwarder(outside)
    came = first(503, vm, 300, p)
    assert came is not None and came >= GAP  # the gap again, from the restart


def a_preempt_draining(notice: int, for_seconds: int) -> tuple[Outside, Forwarder, ScheduledEvent]:
    """A VM healthy for 200 s (the gap seen after its start), then a Preempt of it with
    ``notice`` seconds, draining at first sight for ``for_seconds``."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.later(200)
    event = reboot(A, not_before_in=200 + notice, event_type="Preempt")
    vm.later(for_seconds, event)
    return outside, vm, event


# -- hostile review h51 -------------------------------------------------------------------------
@pytest.mark.parametrize(("in_run", "in_gap"), [(-300, 0), (None, 300), (300, -300)])
def test_a_wall_step_across_a_restart_neither_stretches_a_run_nor_skips_the_gap(
    in_run: int | None, in_gap: int
) -> None:
    """The journal's times were placed again on the new wall clock after a restart: a step back
    during a run stretched it (805 s seen), a step forward took the gap after a spent run for
    over (805 s, 1025 s). The view is stamped with both clocks and the boot as it is written;
    a start in the same boot moves its times by how far the wall clock moved."""
    life = Life()
    life.up(200)
    a = life.event(A, 400, event_type="Preempt")  # first sight; Azure late
    if in_run is None:
        life.up(BOUND + 1, a)
    else:
        life.up(400, a)
        life.down(3, wall_step=in_run)  # in the middle of the run
        life.up(BOUND, a)
    assert life.vm.status == 200  # spent at its bound, not later
    b = life.event(B, 60, event_type="Preempt")
    life.up(4, a, b)
    life.down(3, wall_step=in_gap)  # within the gap after the run
    life.up(900, a, b)
    assert longest(life.balancers) <= LB_BOUND + 3, [x.longest for x in life.balancers]


def test_a_wall_step_across_a_restart_sends_no_early_prepared() -> None:
    """A drain answered 503 for 10 s, a kill -9 while the wall clock stepped +300 s: the replay
    placed its run 313 s back and Prepared went out at the first poll."""
    outside, vm, event = a_preempt_draining(notice=400, for_seconds=10)
    outside.clock.advance(3)
    outside.clock.wall += timedelta(seconds=300)
    vm = Forwarder(outside)
    vm.later(1, event)
    assert vm.status == 503 and vm.prepared() == []
    vm.later(30, event)
    assert len(vm.prepared()) == 1  # 10 + 3 + 31 s of it, not counting the step


def test_a_run_that_goes_on_after_200s_counts_its_drain_time_afresh() -> None:
    """A drain 5 s old, its event left out for 80 s (200: the balancer takes the VM back), then
    back: the run goes on from its start for the bound, but Prepared waits --drain-seconds of
    503 from the return (before: at once, after 6 s of 503 in all)."""
    _, vm, event = a_preempt_draining(notice=120, for_seconds=5)
    vm.later(80)
    vm.later(1, event)
    assert vm.status == 503 and vm.prepared() == []
    vm.later(28, event)
    assert vm.prepared() == []
    vm.later(2, event)
    assert len(vm.prepared()) == 1


def test_a_lost_view_with_nothing_to_drain_puts_no_drain_off() -> None:
    """The journal's view was damaged, the state file shows no event: nothing can have held the
    probe at 503, so a Preempt 5 s after the start drains at once (before: 85 s later)."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.later(300)
    state = ForwarderState(events={}, observed_at=outside.clock.now())
    outside.journal.commit(view={"events": "damaged"}, runs=[], preparations=[])
    outside.clock.advance(3)
    vm = Forwarder(outside, fallback=state)
    vm.later(5)
    preempt = reboot(A, not_before_in=300 + 3 + 5 + 30, event_type="Preempt")
    assert first(503, vm, 200, preempt) == 1


def test_a_chain_that_would_leave_a_run_seconds_counts_it_whole() -> None:
    """Restarts 80 s apart (one chain), then a Preempt 4 s before the chain's first start plus
    the bound: the run was left 4 s, no balancer saw it, and Prepared never went out."""
    life = Life()
    life.up(120)
    life.down(5)
    for _ in range(5):
        life.up(80)
        life.down(5)
    life.up(80)
    preempt = life.preempt(notice=30)
    statuses = []
    for _ in range(40):
        life.up(1, preempt)
        statuses.append(life.vm.status)
    assert statuses.count(503) == 40
    assert len(life.vm.prepared()) == 1


def test_a_drain_left_out_across_a_restart_gets_a_whole_run_when_back() -> None:
    """A Preempt's run 300 s old, the event left out for 300 s, a kill -9, the event back: the
    replay held the left-out drain up to the start, spent it, and the probe answered 200 until
    the event started. It is replayed until it went: back after the gap, a whole new run."""
    outside = Outside()
    vm = Forwarder(outside)
    event = reboot(A, not_before_in=30, event_type="Preempt")  # Azure late to start it
    vm.poll(event)
    vm.later(300, event)
    vm.later(300)
    outside.clock.advance(1)
    vm = Forwarder(outside)
    assert first(503, vm, 600, event) == 1
    assert first(200, vm, BOUND, event) == BOUND - 1


# -- hostile review h52: steps while running, restarts during a run, crafted stamps ---------------
def test_a_wall_step_back_while_running_then_a_write_then_a_restart() -> None:
    """A run 400 s old; the wall clock steps -300 s while the forwarder runs; a neighbour's
    event changes the document (the view is written, stamped with the new clocks); kill -9
    (down 3 s); the run goes on."""
    life = Life()
    life.up(200)
    a = life.event(A, 400, event_type="Preempt")  # first sight; Azure late
    life.up(400, a)
    life.outside.clock.wall -= timedelta(seconds=300)
    n = life.neighbours(0)
    life.up(2, a, n)  # a new document: the view is written after the step
    life.down(3)
    life.up(900, a, n)
    assert longest(life.balancers) <= LB_BOUND + 3, [x.longest for x in life.balancers]


def test_a_wall_step_forward_in_the_gap_then_a_write_then_a_restart() -> None:
    """A spent run; within the gap after it the wall steps +300 s while running, a new
    document is written, kill -9: the gap is taken as over and B's run starts at once."""
    life = Life()
    life.up(200)
    a = life.event(A, 400, event_type="Preempt")
    life.up(BOUND + 1, a)
    assert life.vm.status == 200
    life.outside.clock.wall += timedelta(seconds=300)
    b = life.event(B, 60, event_type="Preempt")
    life.up(4, a, b)  # new document, written
    life.down(3)
    life.up(900, a, b)
    assert longest(life.balancers) <= LB_BOUND + 3, [x.longest for x in life.balancers]


@pytest.mark.parametrize("restart", [False, True])
@pytest.mark.parametrize("write", [False, True])
@pytest.mark.parametrize("step", [-300, 300])
def test_wall_steps_with_and_without_writes_and_restarts(
    restart: bool, write: bool, step: int
) -> None:
    """A wall step while running (back in a run, forward in the gap after one), a document
    written after it or none, a kill -9 or none: the bound and the gap hold in all eight."""
    life = Life()
    life.up(200)
    a = life.event(A, 400, event_type="Preempt")
    if step < 0:
        life.up(400, a)
    else:
        life.up(BOUND + 1, a)
    life.outside.clock.wall += timedelta(seconds=step)
    extra = [life.neighbours(0)] if write else []
    b = life.event(B, 60, event_type="Preempt") if step > 0 else None
    shown = [a, *extra] + ([b] if b else [])
    life.up(4, *shown)
    if restart:
        life.down(3)
    else:
        life.up(3, *shown)
    life.up(900, *shown)
    assert longest(life.balancers) <= LB_BOUND + 3, [x.longest for x in life.balancers]


@pytest.mark.parametrize("restart", [False, True])
def test_prepared_counts_from_the_return_across_a_restart(restart: bool) -> None:
    """A drain 5 s old, its event left out for 20 s (200: within the gap, the run goes on
    when back), back, 3 s of 503, kill -9 (down 1 s): Prepared must still wait 30 s of 503
    without a break from the return."""
    outside, vm, event = a_preempt_draining(notice=120, for_seconds=5)
    vm.later(20)  # left out: 200
    assert vm.status == 200
    vm.later(3, event)  # back: 503
    assert vm.status == 503 and vm.prepared() == []
    if restart:
        outside.clock.advance(1)
        vm = Forwarder(outside)
    else:
        vm.later(1, event)
    vm.later(1, event)
    # 3 + 1 + 1 = 5 s of 503 since the return
    assert vm.status == 503
    assert vm.prepared() == [], "Prepared after 5 s of 503 since the return"


def test_restarts_every_20s_during_a_run_still_send_prepared() -> None:
    """A Preempt's run of 503; kill -9 every 20 s (down 1 s, the probe refused: the balancer
    keeps the VM out). The probe is 503 or refused for the whole bound, yet Prepared never
    goes out: each start takes the run as going on only from the start (follow() evaluates the
    replayed run with no drains first, a phantom 200 that cuts it)."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.later(200)
    event = reboot(A, not_before_in=200 + 400, event_type="Preempt")  # begins at once
    statuses = []
    for _ in range(24):  # 24 x 21 s = 504 s
        for _ in range(20):
            vm.later(1, event)
            statuses.append(vm.status)
        outside.clock.advance(1)
        vm = Forwarder(outside)
    assert set(statuses) == {503}
    assert vm.prepared() != [], "503 (or refused) for 500 s, no Prepared"


def test_one_restart_does_not_start_the_drain_time_again() -> None:
    outside, vm, event = a_preempt_draining(notice=400, for_seconds=25)
    outside.clock.advance(1)
    vm = Forwarder(outside)
    vm.later(10, event)  # 25 + 1 + 10 = 36 s of 503 (refused during the kill)
    assert vm.status == 503
    assert vm.prepared() != [], "Prepared waits 30 s again from the restart"


@pytest.mark.parametrize(
    "patch",
    [
        {"mono_minus": 1e5},  # a crafted mono 100,000 s back: a move of more than a day
        {"wall": "0001-01-01T00:00:00+00:00"},
        {"wall": "9999-12-31T23:59:59+00:00"},
    ],
    ids=["mono-1e5", "wall0001", "wall9999"],
)
def test_an_unbelievable_clock_stamp_is_not_believed(patch: dict[str, object]) -> None:
    """A Preempt drains (10 s of 503), kill -9; the journal's "clock" stamp (same boot id)
    is damaged: one field. After the start the probe answers 200 for 400 s, past NotBefore,
    and Prepared never goes out (a lost view: the gap, then a whole run)."""
    outside, vm, event = a_preempt_draining(notice=400, for_seconds=10)
    outside.clock.advance(1)
    view = dict(outside.journal.load().view or {})
    clock = dict(view["clock"])
    if "mono_minus" in patch:
        clock["mono"] = clock["mono"] - float(patch["mono_minus"])  # type: ignore[arg-type]
    else:
        clock.update(patch)
    view["clock"] = clock
    outside.journal.commit(view=view, runs=[], preparations=[])
    vm = Forwarder(outside)
    came = first(503, vm, 400, event)  # NotBefore is 389 s away
    assert came is not None and came <= GAP + 1, came


def test_a_wall_step_back_while_draining_then_a_write_then_a_restart_keeps_it() -> None:
    """A Preempt (30 s notice) drains; 5 s in, the wall clock steps back 300 s while the
    forwarder runs (an NTP correction); a neighbour's event changes the document (the view
    is written, stamped with the stepped clock); kill -9 (down 3 s). After the start the
    probe answers 200: the drain's begin is taken as 300 s in the future."""
    life = Life()
    life.up(200)
    p = life.preempt(notice=30)
    life.up(5, p)
    assert life.vm.status == 503
    life.outside.clock.wall -= timedelta(seconds=300)
    n = life.neighbours(0)
    life.up(1, p, n)
    assert life.vm.status == 503  # no restart: still draining
    life.down(3)
    statuses = []
    for _ in range(30):  # until NotBefore (true time: 30 - 5 - 1 - 3 = 21 s away)
        life.up(1, p, n)
        statuses.append(life.vm.status)
    assert statuses.count(503) == 30, statuses


def test_a_lost_view_with_a_neighbours_event_puts_no_drain_off() -> None:
    """The journal's view was damaged; the state file shows only a neighbour's event (it
    lists another VM: it can never have held this VM's probe at 503). A Preempt (30 s
    notice) 5 s after the start: put off 85 s, past NotBefore (the documented rule: only an
    event that may have held the probe at 503)."""
    outside = Outside()
    vm = Forwarder(outside)
    neighbour = imds_event(
        "cccccccc-0000-4000-8000-000000000009",
        resources=["other-vm"],
        not_before="Mon, 23 Nov 2026 10:00:00 GMT",
    )
    vm.later(300, neighbour)
    assert vm.status == 200
    state = ForwarderState(events={neighbour.key: neighbour}, observed_at=outside.clock.now())
    outside.journal.commit(view={"events": "damaged"}, runs=[], preparations=[])
    outside.clock.advance(3)
    vm = Forwarder(outside, fallback=state)
    vm.later(5, neighbour)
    preempt = reboot(A, not_before_in=300 + 3 + 5 + 30, event_type="Preempt")
    assert first(503, vm, 200, neighbour, preempt) == 1


# -- hostile review h53: the stop's write, a silent IMDS, a step before the lock -------------------
@pytest.mark.parametrize("step", [-300, 300])
def test_a_wall_step_just_before_a_stop_is_followed_before_the_view_is_written(step: int) -> None:
    """A step back in a run, or forward in the gap after one, then the stop's write (SIGTERM:
    save) before any poll followed it, then a start: the view was stamped with the new clocks
    over times on the old one (805 s seen; the gap skipped). Stamping follows the clock first."""
    life = Life()
    life.up(200)
    a = life.event(A, 400, event_type="Preempt")
    if step < 0:
        life.up(400, a)
        shown = [a]
    else:
        life.up(BOUND + 1, a)
        shown = [a, life.event(B, 60, event_type="Preempt")]
        life.up(2, *shown)
    life.outside.clock.wall += timedelta(seconds=step)
    life.vm.actions.save()
    life.down(3)
    life.up(900, *shown)
    assert longest(life.balancers) <= LB_BOUND + 3, [x.longest for x in life.balancers]


def test_a_wall_step_while_imds_is_silent_leaves_a_begin_to_come_on_notbefore() -> None:
    """A Terminate with 900 s of notice: its 503 is due at NotBefore - 510. IMDS silent after
    the first poll, the wall clock steps +600 s at 100 s: the probe moved the pending begin with
    the step and answered 503 90 s after NotBefore. A begin still to come is NotBefore's."""
    outside = Outside()
    vm = Forwarder(outside)
    terminate = reboot(A, not_before_in=900, event_type="Terminate")
    vm.poll(terminate)
    first_503 = None
    for second in range(1, 700):
        outside.clock.advance(1)
        if second == 100:
            outside.clock.wall += timedelta(seconds=600)
        vm.tick()  # the moments worker only
        if vm.status == 503 and first_503 is None:
            first_503 = outside.clock.now()
    assert first_503 is not None and first_503 <= terminate.not_before


def test_a_wall_step_between_the_polls_clock_read_and_the_lock_keeps_one_clock() -> None:
    """The poll read its time, the wall clock stepped -600 s while document_observed waited for
    the store's lock: the view was moved but the new event's first sight kept the old clock. The
    document's time is read again on a step: everything is on the new clock, as if the step had
    come before the poll."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.later(100)
    outside.clock.advance(1)
    observed_at = outside.clock.now()
    outside.clock.wall -= timedelta(seconds=600)
    preempt = reboot(A, not_before_in=101 + 60, event_type="Preempt")
    vm.actions.document_observed(document(preempt), OBSERVER, observed_at)
    timing = vm.store.view.timing[A.lower()]
    assert timing.first_seen == outside.clock.now()
    assert vm.store.view.observed_at == outside.clock.now()


# -- hostile review h54: Prepared across a restart ------------------------------------------------
def test_a_run_that_went_on_after_200s_keeps_its_drain_time_across_a_restart() -> None:
    """503 for 5 s, left out for 20 s (200), back for 3 s, a kill -9 (down 1 s): the restart
    counted the drain's time from the run's first start and sent Prepared 6 s after the return.
    When the probe last began answering 503 is journaled: it counts from the return."""
    outside, vm, event = a_preempt_draining(notice=120, for_seconds=5)
    vm.later(20)
    vm.later(3, event)
    outside.clock.advance(1)
    vm = Forwarder(outside)
    vm.later(25, event)  # 3 + 1 + 25 = 29 s since the return
    assert vm.status == 503 and vm.prepared() == []
    vm.later(2, event)
    assert len(vm.prepared()) == 1


def test_an_event_back_with_a_short_notice_keeps_its_drain_time_across_a_restart() -> None:
    """A long notice seen at T0, left out for 300 s, back with NotBefore 60 s away (it drains
    at once from its return), 3 s of 503, a kill -9 (down 3 s): Prepared went out at the start,
    the replay counting from the old first sight."""
    outside = Outside()
    vm = Forwarder(outside)
    vm.poll(reboot(A, not_before_in=3600))
    vm.later(300)
    back = reboot(A, not_before_in=300 + 60)
    vm.later(3, back)
    outside.clock.advance(3)
    vm = Forwarder(outside)
    vm.later(22, back)  # 3 + 3 + 22 = 28 s
    assert vm.status == 503 and vm.prepared() == []
    vm.later(3, back)
    assert len(vm.prepared()) == 1


# -- any sequence, as the balancer sees it ---------------------------------------------------------
class BalancerModel(RuleBasedStateMachine):
    """Events of this VM scheduled with any notice, NotBefore passing without a start (Azure
    late), events left out of a document, started, gone; the wall clock stepping both ways;
    long leads. Every phase of a 5 s x 2 balancer watches. Invariant: while no event of this
    VM has started, no balancer shows the VM down longer than the bound and its lag."""

    def __init__(self) -> None:
        super().__init__()
        self.outside = Outside()
        self.vm = Forwarder(self.outside, leads=parse_leads("Reboot=600,Freeze=1200"))
        self.events: dict[str, ScheduledEvent] = {}
        self.balancers = [Balancer(phase) for phase in range(INTERVAL)]

    def started(self) -> bool:
        return any(
            e.is_started and DEFAULT_RULES.is_impactful(e) and OBSERVER.vm_name in e.resources
            for e in self.events.values()
        )

    def second(self, shown: list[ScheduledEvent] | None = None) -> None:
        self.outside.clock.advance(1)
        self.vm.poll(*(self.events.values() if shown is None else shown))
        for balancer in self.balancers:
            balancer.sample(self.outside.clock.mono, self.vm.status, exempt=self.started())

    @rule(
        event_id=st.sampled_from([A, B]),
        kind=st.sampled_from(["Reboot", "Freeze", "Preempt"]),
        notice=st.sampled_from([30, 400, 700, 1111, 1500, 3600]),
    )
    def schedule(self, event_id: str, kind: str, notice: int) -> None:
        if event_id.lower() not in self.events:
            self.events[event_id.lower()] = imds_event(
                event_id,
                event_type=kind,
                not_before=(self.outside.clock.wall + timedelta(seconds=notice)).strftime(
                    "%a, %d %b %Y %H:%M:%S GMT"
                ),
            )
        self.second()

    @initialize(notice=st.sampled_from([700, 1111, 1500, 3600]))
    def a_long_notice(self, notice: int) -> None:
        """Every sequence starts with a Reboot of this VM whose run comes before NotBefore."""
        self.schedule(A, "Reboot", notice)

    @rule(seconds=st.sampled_from([1, 5, 60, 300, 600]))
    def time_passes(self, seconds: int) -> None:
        for _ in range(seconds):
            self.second()

    @rule(event_id=st.sampled_from([A, B]), missing=st.sampled_from([1, 3, 20, 200]))
    def left_out(self, event_id: str, missing: int) -> None:
        """IMDS leaves the event out of a few documents, then shows it again."""
        shown = [e for key, e in self.events.items() if key != event_id.lower()]
        for _ in range(missing):
            self.second(shown)
        self.second()  # and shows it again

    @rule(event_id=st.sampled_from([A, B]))
    def start(self, event_id: str) -> None:
        event = self.events.get(event_id.lower())
        if event is not None and not event.is_started:
            raw = event.to_imds() | {"EventStatus": "Started", "NotBefore": ""}
            self.events[event.key] = ScheduledEvent.from_imds(raw, strict=False)
        self.second()

    @rule(event_id=st.sampled_from([A, B]))
    def gone(self, event_id: str) -> None:
        self.events.pop(event_id.lower(), None)
        self.second()

    @rule(down=st.sampled_from([1, 3, DOWN_AT_MOST]))
    def restart(self, down: int) -> None:
        """kill -9, down for ``down`` s (the balancer sees the probe refused: unhealthy), and
        start again from the journal."""
        for _ in range(down):
            self.outside.clock.advance(1)
            for balancer in self.balancers:
                balancer.sample(self.outside.clock.mono, 503, exempt=self.started())
        self.vm = Forwarder(self.outside, leads=parse_leads("Reboot=600,Freeze=1200"))
        self.second()

    @rule(step=st.sampled_from([-3600, -300, -30, 30, 300, 3600]))
    def wall_clock_steps(self, step: int) -> None:
        self.outside.clock.wall += timedelta(seconds=step)
        self.second()

    @invariant()
    def no_balancer_sees_a_longer_run_than_the_bound(self) -> None:
        # A drain whose moment came while the forwarder was down began then: its run goes on
        # after the restart, and the balancer saw the probe refused just before it.
        assert longest(self.balancers) <= LB_BOUND + DOWN_AT_MOST, [
            b.longest for b in self.balancers
        ]

    @invariant()
    def a_started_event_always_drains(self) -> None:
        if self.started():
            assert self.vm.status == 503, (self.events, self.vm.probe._drains)


def test_a_restart_gives_the_balancer_its_healthy_gap_even_with_no_run_before() -> None:
    """Found by the model above: a restart 20 s down, 6 s of 200, a restart 1 s down, 5 s of
    200, then a short notice: no balancer phase saw two 200s in a row, so it showed one
    stretch of 545 s (the refused probe, the short 200s, the run of 510 s). Counting the gap
    from every restart (tried, reverted) delayed first-sight drains past NotBefore. Now a run
    that begins within the gap after a start still begins at once, and counts its bound from
    that start, or from the first of the starts in a row each within the gap of the last."""
    model = BalancerModel()
    model.a_long_notice(notice=700)
    model.restart(down=1)
    model.gone(A)
    model.gone(A)
    model.restart(down=DOWN_AT_MOST)
    model.time_passes(seconds=5)
    model.restart(down=1)
    for _ in range(4):
        model.gone(A)
    model.schedule(A, "Reboot", notice=30)
    model.time_passes(seconds=600)
    model.no_balancer_sees_a_longer_run_than_the_bound()


BalancerModel.TestCase.settings = settings(
    max_examples=examples(60),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_balancer_model = BalancerModel.TestCase
# About 30 s: make check leaves it to make test, and parallel runs start it early.
test_balancer_model.pytestmark = [pytest.mark.slow]


def test_the_default_gap_covers_the_balancers_we_document() -> None:
    # Azure Load Balancer 5 s x 2, Application Gateway 30 s x 3 (the slowest default).
    assert max(5 * 2 + 5, 30 * 3) <= DEFAULT_PROBE_MIN_HEALTHY_SECONDS
