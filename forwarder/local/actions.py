"""Actions on the VM itself, plugged into the forwarder's loop: hooks and the drain probe.

:class:`LocalActions` is a consumer of IMDS documents in its own right, not of the delivery
path: the poller hands it every document it read (``document_observed``), before and
independently of the outbox and the state file. It keeps its own view of the events (in
memory and in its journal, :mod:`sebridge.forwarder.local.store`), diffs each document against
it with the forwarder's own diff and message ids, and commits in one journal transaction the
new view with the hook runs and preparation changes the transitions call for. A crash before
that commit derives the same transitions (same ids) again after the restart; after it, the
pending runs resume. The drain probe follows the document itself. Nothing here waits for a
hook or a client: hooks run on the hooks worker's threads, the probe on its own. ``Prepared``
goes through ``deliver``, the forwarder's outbox.

When: the prepare hooks and the probe's drain wait for each event's **drain moment**
(:func:`sebridge.timing.drain_moment`: ``NotBefore`` minus ``--drain-lead`` for its type, at
first sight for Preempt, Terminate and short notices); the other hooks run on their
transitions. The view keeps, per event, when it was first seen, the moment once it passed and
the cause whose prepare hooks wait (:class:`~sebridge.forwarder.local.store.Timing`), in the
same journal transaction as everything else: a restart loses no pending moment, and fires none
twice (a hook run is keyed by its transition's message id and the hook). An Updated moves a
pending moment; a moment that has passed stays passed (the drain and the hooks are not undone
and done again); an event that vanishes takes its moment with it. :meth:`LocalActions.fire_due`
fires the moments that came (the ``moments`` worker, every second, and every document).

Their flags and settings are :mod:`sebridge.forwarder.local.settings`; the forwarder imports
this module only when one of them is set.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sebridge import lifecycle
from sebridge.contract.events import Envelope, Observer, Transition
from sebridge.forwarder.imds.diff import diff, remember
from sebridge.forwarder.local.drain_probe import DrainProbe, ProbeError
from sebridge.forwarder.local.hooks_file import HooksFile, HooksFileError, load_hooks
from sebridge.forwarder.local.journal import Journal, JournalError, Run
from sebridge.forwarder.local.preparation import Observed, Preparations
from sebridge.forwarder.local.settings import (  # re-exported: the settings' old home
    DEFAULT_DRAIN_SECONDS,
    DEFAULT_PROBE_ADDRESS,
    NO_LOCAL_ACTIONS,
    LocalActionsError,
    LocalSettings,
    add_arguments,
    settings_from_args,
)
from sebridge.forwarder.local.store import (
    MAX_UNJUDGED,
    ClockPair,
    Gone,
    LocalStore,
    Timing,
    Unjudged,
    View,
)
from sebridge.forwarder.local.worker import HookWorker, Job
from sebridge.forwarder.state import ForwarderState, bounded_lives, is_identity
from sebridge.imds import Document, ScheduledEvent, isoformat_utc
from sebridge.times import shifted
from sebridge.timing import (
    DEFAULT_LEADS,
    MAX_RECENT,
    RECENT_SECONDS,
    Leads,
    drain_moment,
    probe_begins,
)

__all__ = [
    "DEFAULT_DRAIN_SECONDS",
    "DEFAULT_PROBE_ADDRESS",
    "NO_LOCAL_ACTIONS",
    "LocalActions",
    "LocalActionsError",
    "LocalSettings",
    "add_arguments",
    "build_local_actions",
    "settings_from_args",
]

log = logging.getLogger("forwarder.local")

MOMENT_TICK = 1.0  # seconds between two looks at the drain moments (hooks start within it)


def _utc_now() -> datetime:
    return datetime.now(UTC)


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
WALL_STEP = timedelta(seconds=1)  # a smaller move of the wall clock is left alone
MAX_WALL_STEP = timedelta(days=1)  # a journal's stamp claiming more is not believed
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def boot_id() -> str | None:
    """This boot's id (Linux), within which the monotonic clock counts on across restarts;
    None where it cannot be read."""
    try:
        return BOOT_ID.read_text(encoding="ascii", errors="replace").strip()[:64] or None
    except OSError:
        return None


def latest_transition(event: ScheduledEvent, life: lifecycle.Life | None) -> tuple[Transition, str]:
    """The latest transition an event that is present reported, with its message id (the same
    as :func:`sebridge.lifecycle.advance` gave it): Started once it started, else its latest
    Updated if its content ever changed, else its Scheduled."""
    ref = lifecycle.event_ref(event.event_id)
    appearance = life.appearance if life is not None else 1
    if event.is_started:
        return Transition.STARTED, lifecycle.message_id(ref, Transition.STARTED.value, appearance)
    versions = list(life.versions.items()) if life is not None else []
    if len(versions) > 1 or (versions and versions[0][1] > 1):
        digest, occurrence = versions[-1]
        return Transition.UPDATED, lifecycle.message_id(
            ref, Transition.UPDATED.value, appearance, digest=digest, occurrence=occurrence
        )
    return Transition.SCHEDULED, lifecycle.message_id(ref, Transition.SCHEDULED.value, appearance)


class LocalActions:
    """A consumer of IMDS documents in its own right (``document_observed``), with its own view
    of the events in the store, and the workers to run."""

    def __init__(
        self,
        store: LocalStore,
        preparations: Preparations,
        hooks: HookWorker | None,
        probe: DrainProbe | None,
        *,
        leads: Leads = DEFAULT_LEADS,
        now: Callable[[], datetime] = _utc_now,
        boot: Callable[[], str | None] = boot_id,
    ) -> None:
        self.store = store
        self.journal = store.journal
        self.preparations = preparations
        self.hooks = hooks
        self.probe = probe
        self.leads = leads
        self.now = now
        # The monotonic clock the probe measures runs on, and the boot it counts in: the view
        # is stamped with both as it is written, so that a start in the same boot tells how
        # far the wall clock moved meanwhile.
        self.monotonic = probe.monotonic if probe is not None else None
        self.boot = boot() if self.monotonic is not None else None
        self._drift: float | None = None  # wall minus monotonic at the last look (seconds)
        if self.monotonic is not None and self.boot is not None:
            store.clock = self._stamp

    def _clock_pair(self) -> ClockPair | None:
        if self.monotonic is None or self.boot is None:
            return None
        return ClockPair(self.now(), self.monotonic(), self.boot)

    def _drift_now(self) -> float:
        """The wall clock minus the monotonic one now, in seconds (monotonic clock known)."""
        assert self.monotonic is not None
        return (self.now() - EPOCH).total_seconds() - self.monotonic()

    def _stamped_drift(self, view: View) -> float | None:
        """The wall clock minus the monotonic one as ``view`` was written in this boot: the
        previous run's last look, from which :meth:`_follow_wall_clock` tells a step made while
        the forwarder was down. None when it cannot be told (another boot, no stamp) or cannot
        be true (from the future, or a step of more than :data:`MAX_WALL_STEP`)."""
        pair = view.clock
        if pair is None or pair.boot != self.boot or self.monotonic is None:
            return None
        if self.monotonic() < pair.mono:
            return None
        drift = (pair.wall - EPOCH).total_seconds() - pair.mono
        moved = self._drift_now() - drift
        if abs(moved) > MAX_WALL_STEP.total_seconds():
            log.warning(
                "local actions: the journal's clock stamp would move its times by %+.0f s: not "
                "believed (more than %d s), its times are kept as they are",
                moved,
                MAX_WALL_STEP.total_seconds(),
            )
            return None
        return drift

    def _follow_wall_clock(self) -> timedelta:
        """(Under the store's lock; at every document and moments tick, before anything is
        recorded.) When the wall clock stepped since the last look (it moved against the
        monotonic clock by :data:`WALL_STEP` or more), move the view's times and the probe's
        with it, so that every time journaled stays on the clock of the stamp written with it
        (a restart in this boot then moves them all by one step, not some by two). Returns the
        step (zero: none)."""
        if self.monotonic is None:
            return timedelta(0)
        drift = self._drift_now()
        last, self._drift = self._drift, drift
        if last is None or abs(drift - last) < WALL_STEP.total_seconds():
            if last is not None:
                self._drift = last  # slow slews add up until they make a step
            return timedelta(0)
        step = timedelta(seconds=drift - last)
        log.warning(
            "local actions: the wall clock stepped %+.0f s: the times kept move with it",
            step.total_seconds(),
        )
        self.store.set_view(self.store.view.moved(step))
        if self.probe is not None:
            self.probe.wall_moved(step)
        return step

    def _stamp(self) -> ClockPair | None:
        """(The store's clock, as it writes the view, under its lock.) Follow the wall clock
        first: a view written after a step (at stop, or from another thread) is moved before
        it is stamped with the clocks of the new step."""
        with self.store.lock:
            self._follow_wall_clock()
        return self._clock_pair()

    # -- the listener -----------------------------------------------------------------------
    def document_observed(
        self, document: Document, observer: Observer, observed_at: datetime
    ) -> list[Observed]:
        """Every document a poll read, on the poller's thread, before the forwarder writes
        anything: diff it against the local view (the forwarder's diff and message ids), and
        in one journal transaction record the new view (with when to act on each event) and the
        hook runs and preparation changes its transitions call for, the prepare hooks once
        their event's drain moment has come; then run those hooks and let the probe follow the
        document. Never waits on a hook; a journal that cannot be written delays nothing.
        Returns the transitions derived (for tests)."""
        observed: list[Observed] = []
        jobs: list[Job] = []
        with self.store.lock:
            if self._follow_wall_clock():
                # The wall clock stepped, maybe after the poll read it: this document's time is
                # read again, on the clock the view was just moved to.
                observed_at = self.now()
            before = view = self.store.view
            new: View | None = None
            try:
                if view.observer is not None and view.observer != observer:
                    # This VM is known by another name now (its identity resolved or changed):
                    # the events it already knows are judged again under it before the new
                    # document.
                    view, reevaluated = self._reevaluate(view, observer, observed_at)
                    jobs += reevaluated
                if view.timing:
                    # The moments that came since the last document fire first, as the
                    # moments worker would have fired them: a revision whose moment came while
                    # it was current has its prepare hooks run even when this document brings
                    # the next revision (the re-judging replays exactly this rule).
                    view = replace(view, timing=dict(view.timing))
                    jobs += self._advance(view, observed_at)
                changes = diff(view.events, document, observed_at, last_seen=view.observed_at)
                lives = dict(view.lives)
                for change in changes:
                    key = change.event.key
                    life, message_id = lifecycle.advance(
                        lives.pop(key, None), change.transition.value, change.event
                    )
                    lives[key] = life  # re-inserted: the most recently touched come last
                    observed.append(
                        Observed(
                            change.transition,
                            change.event,
                            message_id,
                            observer,
                            document.incarnation,
                        )
                    )
                present = {event.key for event in document.events}
                events = remember(view.events, document.events)
                timing, recent = self._carry_timing(view, events, observed_at)
                new = replace(  # what the document does not change is kept as it is
                    view,
                    events=events,
                    lives=bounded_lives(lives, present),
                    observed_at=observed_at,
                    incarnation=document.incarnation,
                    observer=observer,
                    timing=timing,
                    unjudged=self._unjudged(view.unjudged, observer, observed, timing, observed_at),
                    recent=recent,
                )
                for item in observed:
                    self.preparations.observe(item)
                    jobs += self._record_transition(item, new, observed_at)
                jobs += self._advance(new, observed_at)
                self.store.set_view(
                    new,
                    # Like the forwarder's state file: written when something changed (and at
                    # stop).
                    persist=bool(changes)
                    or document.incarnation != before.incarnation
                    or new.timing != before.timing
                    or new.recent != before.recent
                    or new.observer != before.observer,
                )
            finally:
                # The probe follows the document whatever failed above (a hook, a timing, the
                # journal): its verdict never depends on theirs. Without the new view's timing,
                # the events it knows keep their begins and the others drain at first sight.
                if self.probe is not None:
                    self.probe.follow(document.events, observer, self._probe_begins(new or before))
                    self._keep_probe_healthy_since()
            self.store.flush()  # the one transaction; on failure all of it stays dirty
        for item in observed:
            log.debug("local actions: %s %s", item.transition.value, item.message_id)
        if self.hooks is not None:
            self.hooks.queue(jobs)
        self.preparations.check_all()  # in the forwarder, refused until the poll recorded
        return observed

    def poll_recorded(self) -> None:
        """A poll's transitions are in the outbox (Forwarder._tell_recorded): a Prepared
        that is ready, or that the outbox refused while they were not, goes in now, after
        them. From inside the poll (document_observed) the forwarder refuses it for as long as
        the poll derives its event's transitions: with only those tries, a Prepared whose own
        attempt (a hook or the drain ending) met a poll in progress waited for ever."""
        self.preparations.check_all()

    def _keep_probe_healthy_since(self) -> None:
        """(Under the store's lock.) Journal when the probe last stopped answering 503, once it
        changes (at most once a run): after a restart the healthy gap counts from it; and
        once, after a start, that the probe has answered 200 for the gap since: the next start
        is not one of restarts in a row."""
        assert self.probe is not None
        since = self.probe.healthy_since
        view = self.store.view
        if since is not None and since != view.probe_healthy_since:
            view = replace(view, probe_healthy_since=since)
            self.store.set_view(view)
        began = self.probe.unhealthy_since
        if began is not None and began != view.probe_unhealthy_since:
            view = replace(view, probe_unhealthy_since=began)
            self.store.set_view(view)
        seen = view.seen_healthy is not None or view.started_at is None
        if not seen and not self.probe.in_the_dark:
            self.store.set_view(replace(view, seen_healthy=self.now()))

    def _unjudged(
        self,
        kept: tuple[Unjudged, ...],
        observer: Observer,
        observed: Sequence[Observed],
        timing: Mapping[str, Timing],
        observed_at: datetime,
    ) -> tuple[Unjudged, ...]:
        """The transitions to judge again once this VM's identity resolves: none while it is
        known (judged by instance metadata's name), else those kept plus ``observed``, each
        with when it was observed and (a Scheduled or Updated) its event's drain moment then.
        The moment does not depend on whose name judged: it is the one an identity would have
        waited for."""
        if is_identity(observer):
            return ()
        added = tuple(
            Unjudged(
                item.transition.value,
                item.message_id,
                item.event,
                item.incarnation,
                observed_at,
                self._revision_moment(item, timing.get(item.event.key)),
            )
            for item in observed
        )
        out = kept + added
        if len(out) > MAX_UNJUDGED:
            log.warning(
                "local actions: more than %d transitions judged by the host name: the oldest "
                "will not be judged again when this VM's identity resolves",
                MAX_UNJUDGED,
            )
        return out[-MAX_UNJUDGED:]

    def _revision_moment(self, item: Observed, timing: Timing | None) -> datetime | None:
        """The drain moment a Scheduled or Updated waits for as it is observed; None for the
        other transitions, or when it cannot be worked out (logged)."""
        if timing is None or item.transition not in (Transition.SCHEDULED, Transition.UPDATED):
            return None
        try:
            return self.moment(item.event, timing)
        except Exception:
            log.exception("the drain moment of %s failed: not kept", item.message_id)
            return None

    def _reevaluate(self, view: View, observer: Observer, now: datetime) -> tuple[View, list[Job]]:
        """(Under the store's lock.) ``view`` judged again as seen by ``observer``, as if it had
        been this VM's name from the start: every transition judged by a fallback name (the
        host name) since the last judgment by an identity is observed again under it, in order
        and with its own message id (events that ended meanwhile too), then each known event's
        latest transition (its Scheduled or Updated, or its Started) if that was not among them.
        The hooks of every phase, the preparation (Prepared), the drain moments and the prepare
        hooks that now concern this VM follow (runs that already ran are never run twice: they
        are keyed by message id and hook; a prepare hook whose event started or ended is skipped
        as too late), and those that no longer concern it end. The runs that wait are judged
        again first (:meth:`HookWorker.rebind`): this VM's own work never waits behind a
        neighbour's lane."""
        new = replace(
            view,
            observer=observer,
            timing=dict(view.timing),
            unjudged=() if is_identity(observer) else view.unjudged,
        )
        log.info(
            "local actions: this VM is now %r (was %r): %d known event(s) and %d transition(s) "
            "judged again",
            observer.vm_name,
            view.observer.vm_name if view.observer else None,
            len(view.events),
            len(view.unjudged),
        )
        if self.hooks is not None:
            self.hooks.rebind(lambda item: replace(item, observer=observer))
        items: list[tuple[Observed, Unjudged | None]] = []
        for record in view.unjudged:
            try:
                transition = Transition(record.transition)
            except ValueError:
                log.error("damaged record of %s: not judged again", record.message_id)
                continue
            item = Observed(
                transition, record.event, record.message_id, observer, record.incarnation
            )
            items.append((item, record))
        judged = {item.message_id for item, _ in items}
        for key, event in view.events.items():
            transition, message_id = latest_transition(event, view.lives.get(key))
            if message_id not in judged:
                latest = Observed(transition, event, message_id, observer, view.incarnation)
                items.append((latest, None))
        jobs: list[Job] = []
        for index, (item, kept) in enumerate(items):
            self.preparations.observe(item)
            later = next(
                (
                    then
                    for _, then in items[index + 1 :]
                    if then is not None and then.event.key == item.event.key
                ),
                None,
            )
            superseded = None
            if kept is not None and later is not None:
                superseded = self._record_superseded(item, kept, later)
            if superseded is None:
                superseded = self._record_transition(item, new, now)
            jobs += superseded
        return new, jobs

    def _record_superseded(
        self, item: Observed, record: Unjudged, later: Unjudged
    ) -> list[Job] | None:
        """(Under the store's lock.) The hook runs of a Scheduled or Updated judged again that
        its event's next transition followed, or None when it is not one (or a record from
        before the times were kept: it is judged as the latest revision is). Its prepare hooks
        ran, for an identity, if its drain moment came before the next transition was observed
        (the moments that came fire before a document's transitions), or if that transition
        was Started, which fires a waiting moment at once (the hooks worker then skips them as
        too late); else only its other hooks did."""
        if item.transition not in (Transition.SCHEDULED, Transition.UPDATED):
            return None
        if later.transition == Transition.STARTED.value:
            came = True
        elif record.moment is not None and later.at is not None:
            came = record.moment <= later.at
        else:
            return None
        if self.hooks is None:
            return []
        runs = self.hooks.runs_for(item)
        return self._record(runs if came else [run for run in runs if not run.prepare], item)

    # -- when to act --------------------------------------------------------------------------
    def _carry_timing(
        self, view: View, events: Mapping[str, ScheduledEvent], observed_at: datetime
    ) -> tuple[dict[str, Timing], dict[str, Gone]]:
        """The timing of each event of the new view: kept for the events already known, first
        seen now for the new ones (a view from before issue 24 knows events without a timing:
        first seen at its last poll). An event IMDS left out of a document and shows again
        within :data:`~sebridge.timing.RECENT_SECONDS` keeps the timing it had (first seen, the
        moment that passed, when the probe's 503 began), remembered for at most
        :data:`~sebridge.timing.MAX_RECENT` events: a flap restarts nothing. That memory is
        part of the view (journaled with it): a restart between the two documents forgets
        nothing. Returns the new view's timing and memory."""
        recent = dict(view.recent)
        for key, timing in view.timing.items():
            if key not in events:
                recent.pop(key, None)
                drained = self._drained(view.events.get(key), view.observer)
                recent[key] = Gone(observed_at, timing, drained)
        horizon = shifted(observed_at, -RECENT_SECONDS)
        for key in [k for k, gone in recent.items() if not horizon <= gone.at]:
            del recent[key]
        while len(recent) > MAX_RECENT:
            del recent[next(iter(recent))]
        out = {}
        for key in events:
            kept: Timing | None = view.timing.get(key)
            if kept is None and key in recent:
                gone = recent.pop(key)
                kept = replace(gone.timing, prepare=None)
                log.info("local actions: %s is back: it keeps its timing", key)
                away = (observed_at - gone.at).total_seconds()
                if self.probe is not None and kept.probe_from and away > self.probe.min_healthy:
                    # Back after the balancer saw the probe healthy for the whole gap: its run
                    # starts afresh now (a run never starts before the probe last answered
                    # 200). Journaled, so that a restart replays this run, not the old one.
                    kept = replace(kept, probe_from=observed_at)
            if kept is None:
                known = key in view.events and view.observed_at is not None
                kept = Timing(view.observed_at if known and view.observed_at else observed_at)
            out[key] = kept
        return out, recent

    def _drained(self, event: ScheduledEvent | None, observer: Observer | None) -> bool:
        """Whether ``event`` drained this VM through the probe, not started."""
        return (
            self.probe is not None
            and event is not None
            and observer is not None
            and not event.is_started
            and self.probe.applies(event, observer)
        )

    def moment(self, event: ScheduledEvent, timing: Timing) -> datetime:
        """The event's drain moment: the one that passed, or the one to come."""
        return timing.fired or drain_moment(event, timing.first_seen, self.leads)

    def _record(self, runs: Sequence[Run], item: Observed) -> list[Job]:
        assert self.hooks is not None
        return [self.hooks.job(run, item) for run in self.store.add_runs(runs)]

    def _record_transition(self, item: Observed, view: View, now: datetime) -> list[Job]:
        """(Under the store's lock.) The hook runs of one transition: the prepare hooks of a
        Scheduled or Updated wait for the event's drain moment unless it has come (they then
        run first, in the order of the hooks file, as the others do); the others run now."""
        if self.hooks is None:
            return []
        runs = self.hooks.runs_for(item)
        key = item.event.key
        timing = view.timing.get(key)
        if timing is None or item.transition not in (Transition.SCHEDULED, Transition.UPDATED):
            return self._record(runs, item)  # gone (Completed, Cancelled), or Started
        if not any(run.prepare for run in runs):
            view.timing[key] = replace(timing, prepare=None)  # nothing to prepare for now
            return self._record(runs, item)
        moment = self.moment(item.event, timing)
        if moment <= now:
            view.timing[key] = replace(timing, fired=timing.fired or moment, prepare=None)
            return self._record(runs, item)
        view.timing[key] = replace(timing, prepare=(item.message_id, item.transition.value))
        log.info(
            "prepare hooks for %s wait for its drain moment %s (NotBefore %s, lead %s)",
            item.message_id,
            isoformat_utc(moment),
            isoformat_utc(item.event.not_before) if item.event.not_before else "unknown",
            self.leads.describe().get(item.event.event_type, "first-sight"),
        )
        return self._record([run for run in runs if not run.prepare], item)

    def _advance(self, view: View, now: datetime) -> list[Job]:
        """(Under the store's lock.) Fire the drain moments that came by ``now`` (or whose event
        started): fix them, record the prepare hooks that waited, and fix when the probe's 503
        began. Changes ``view.timing``; returns the jobs to queue."""
        jobs: list[Job] = []
        for key, event in view.events.items():
            timing = view.timing.get(key)
            if timing is None:
                continue
            moment = self.moment(event, timing)
            if timing.fired is None and (moment <= now or event.is_started):
                timing = replace(timing, fired=min(moment, now))
                log.info(
                    "drain moment of %s: %s",
                    event.event_id,
                    "it started" if moment > now else isoformat_utc(moment),
                )
            if timing.fired is not None and timing.prepare is not None:
                jobs += self._record_waiting(event, timing.prepare, view)
                timing = replace(timing, prepare=None)
            if self.probe is not None and timing.probe_from is None and not event.is_started:
                begins = probe_begins(event, timing.fired or moment, self.probe.bound)
                if begins <= now:
                    timing = replace(timing, probe_from=begins)
            view.timing[key] = timing
        return jobs

    def _record_waiting(
        self, event: ScheduledEvent, cause: tuple[str, str], view: View
    ) -> list[Job]:
        """The prepare hooks of ``cause`` (message id, transition), whose moment came."""
        if self.hooks is None or view.observer is None:
            return []
        message_id, transition = cause
        try:
            item = Observed(
                Transition(transition), event, message_id, view.observer, view.incarnation
            )
        except ValueError:
            log.error("damaged timing record for %s: its prepare hooks are dropped", event.event_id)
            return []
        jobs = self._record([run for run in self.hooks.runs_for(item) if run.prepare], item)
        if jobs:
            log.info("drain moment of %s: %d prepare hook run(s) queued", message_id, len(jobs))
        return jobs

    def _probe_begins(self, view: View) -> dict[str, datetime]:
        """When the probe's 503 begins for each event that has not started; an event whose
        begin cannot be worked out is left out (it drains at first sight), logged."""
        assert self.probe is not None
        out = {}
        for key, event in view.events.items():
            timing = view.timing.get(key)
            if timing is None or event.is_started:
                continue
            try:
                out[key] = timing.probe_from or probe_begins(
                    event, self.moment(event, timing), self.probe.bound
                )
            except Exception:
                log.exception("the drain moment of %s failed: drained at first sight", key)
        return out

    def fire_due(self) -> int:
        """Fire the drain moments that have come (the ``moments`` worker, every
        :data:`MOMENT_TICK`; tests call it with their own clock): record and queue the prepare
        hooks that waited for them, in one journal transaction with the view. Returns how many
        hook runs it queued."""
        now = self.now()
        jobs: list[Job] = []
        with self.store.lock:
            self._follow_wall_clock()
            view = self.store.view
            if not view.timing:
                return 0
            new = replace(view, timing=dict(view.timing))
            jobs = self._advance(new, now)
            if new.timing == view.timing:
                return 0
            self.store.set_view(new)
            self.store.flush()
        if self.hooks is not None:
            self.hooks.queue(jobs)
        return len(jobs)

    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        """Not used: the local actions follow the documents, not the delivery path."""

    def polled(self, health: object) -> None:
        """After every poll tick: a journal that could not be written is tried again even
        when IMDS did not answer."""
        if self.store.behind_since is not None:
            self.store.flush()

    # -- lifecycle --------------------------------------------------------------------------
    def start(self, fallback: ForwarderState | None = None) -> None:
        """At start, before the first poll: read the journal (a journal without a view takes
        the forwarder's state as its view), drain again for what the view shows, queue the
        hooks a crash cut short and those whose moment came while it was down, and publish
        what was prepared but not yet published."""
        restarted = self.store.load()
        lost = False
        if restarted:
            self._drift = self._stamped_drift(self.store.view)
        with self.store.lock:
            # A step since the journal was written in this boot moves its times, as one while
            # running does; from here on, steps are followed.
            self._follow_wall_clock()
        if not restarted and fallback is not None:
            log.info(
                "local actions: no view in the journal yet: starting from the forwarder's state"
            )
            self.store.set_view(View.of(fallback))
            self.store.flush()
            # The forwarder ran before, but the journal's view was lost (damaged, or from before
            # it was kept): when its drains began is unknown, so nothing is replayed, and if an
            # event it knew may have held the probe at 503 (_may_have_drained), a new run waits
            # the whole healthy gap from now. With none, a drain is not put off.
            lost = fallback.observed_at is not None and any(
                self._may_have_drained(event, fallback.identity)
                for event in fallback.events.values()
            )
        if self.probe is not None:
            self._came_up()
        with self.store.lock:
            view = self.store.view
            if view.events.keys() - view.timing.keys():
                at = view.observed_at or self.now()
                timing, recent = self._carry_timing(view, view.events, at)
                self.store.set_view(replace(view, timing=timing, recent=recent))
                view = self.store.view
        if self.probe is not None and lost:
            self.probe.restarted({}, False, self.now())
        if self.probe is not None and view.observer is not None:
            begins = self._probe_begins(view)
            started = any(
                event.is_started and self.probe.applies(event, view.observer)
                for event in view.events.values()
            )
            if restarted:
                # Before the probe follows the view: the drains present and those left out
                # lately are replayed together, in one history, as they ran before the restart;
                # the healthy gap counts from the probe's last 503 before it.
                drains = {
                    key: begin
                    for key, begin in begins.items()
                    if self._drained(view.events[key], view.observer)
                }
                left_out = {
                    key: gone.timing.probe_from
                    for key, gone in view.recent.items()
                    if gone.drained and gone.timing.probe_from is not None
                }
                gone = {key: view.recent[key].at for key in left_out if key not in drains}
                self.probe.restarted(
                    {**left_out, **drains},
                    started,
                    view.probe_healthy_since,
                    gone,
                    view.probe_unhealthy_since,
                )
            self.probe.follow(view.events.values(), view.observer, begins)
            if (restarted or lost) and self.probe.draining:
                log.info("draining again after a restart, from the journal's view")
        if self.hooks is not None:
            self.hooks.resume()
        self.fire_due()  # the moments that came while the forwarder was down
        self.preparations.check_all()

    def _may_have_drained(self, event: ScheduledEvent, observer: Observer | None) -> bool:
        """Whether ``event``, known to an earlier run whose view was lost, may have held the
        probe at 503 then: not started, of this VM (when its identity is known) and impactful,
        and its 503's begin may have come (at the earliest, first seen long ago)."""
        if self.probe is None or event.is_started:
            return False
        if observer is not None and not self.probe.applies(event, observer):
            return False
        if not self.probe.rules.is_impactful(event):
            return False
        try:
            moment = drain_moment(event, EPOCH, self.leads)
            return probe_begins(event, moment, self.probe.bound) <= self.now()
        except Exception:
            log.exception("the drain moment of %s failed: taken as come", event.event_id)
            return True  # cannot tell: as if it had

    def _came_up(self) -> None:
        """(At start, the probe configured.) Journal this start, and since when the balancer
        may not have seen the probe healthy for the gap: this start, or, when the probe never
        answered 200 for the gap since the last start (restarts in a row, each refused while
        the process was down), the last start's own such time; tell the probe, before its
        replay. One journal write per start, before the first poll."""
        assert self.probe is not None
        now = self.now()
        mono = self.probe.monotonic() if self.probe.monotonic is not None else None
        boot = self.boot if mono is not None else None
        with self.store.lock:
            view = self.store.view
            dark, dark_mono = now, mono
            if (
                view.started_at is not None
                and view.seen_healthy is None
                and view.dark_since is not None
                and view.dark_since <= view.started_at
            ):
                dark = min(view.dark_since, now)
                kept = view.dark_mono if boot is not None and view.boot == boot else None
                dark_mono = kept if kept is not None and mono is not None and kept <= mono else None
            self.store.set_view(
                replace(
                    view,
                    started_at=now,
                    dark_since=dark,
                    seen_healthy=None,
                    dark_mono=dark_mono,
                    boot=boot,
                )
            )
            self.store.flush()
        if dark < now:
            log.info(
                "drain probe: the probe has not answered 200 for %g s since %s (restarts in a "
                "row): a run of 503 that begins before it has counts its bound from then",
                self.probe.min_healthy,
                isoformat_utc(dark),
            )
        self.probe.came_up(dark, dark_mono)

    def workers(self, stop: threading.Event) -> tuple[Callable[[], None], ...]:
        """The threads to run beside the poller (each returns once ``stop`` is set)."""
        out: list[Callable[[], None]] = []
        hooks, probe = self.hooks, self.probe

        def moments() -> None:
            while not stop.wait(MOMENT_TICK):
                try:
                    self.fire_due()
                except Exception:
                    log.exception("firing the drain moments failed; going on")

        out.append(moments)
        if hooks is not None:

            def hooks_worker() -> None:
                hooks.run(stop)

            out.append(hooks_worker)
        if probe is not None:

            def drain_probe() -> None:
                probe.serve(stop)

            out.append(drain_probe)
        return tuple(out)

    def heartbeat_health(self) -> dict[str, Any]:
        """What a Heartbeat carries about local actions: only what is wrong."""
        out: dict[str, Any] = {}
        if self.hooks is not None:
            out.update(self.hooks.health())
        if self.preparations.failed_count:
            out["notPrepared"] = self.preparations.failed_count
        if self.store.behind_since is not None:
            out["journalWriteFailing"] = True
            out["journalWriteFailingSince"] = isoformat_utc(self.store.behind_since)
        return out

    def save(self) -> None:
        """At stop: keep when the last poll was (the view), so that a restart measures its
        observation gap from it. Safe beside threads still at work (a command, a hook): the
        store writes under its lock, one crash-safe journal transaction."""
        self.store.persist_view()
        self.store.flush()

    def close(self) -> None:
        """At stop, once no thread uses them any more: :meth:`save`, then close the journal."""
        self.save()
        self.journal.close()


def build_local_actions(
    settings: LocalSettings,
    state_dir: Path,
    deliver: Callable[[Envelope], bool],
    *,
    trusted_owners: Sequence[int] = (0,),
    base_env: Mapping[str, str] | None = None,
) -> LocalActions | None:
    """The composition of the local actions; None when none is configured. ``deliver`` hands
    Prepared to the forwarder's outbox (True once it is durably there). Raises
    :class:`LocalActionsError` with what stops the start: a refused or invalid hooks file, a
    probe port that cannot be bound, a journal that cannot be opened."""
    if not settings.enabled:
        return None
    hooks_file: HooksFile | None = None
    if settings.hooks_file is not None:
        try:
            hooks_file = load_hooks(settings.hooks_file, trusted_owners)
        except HooksFileError as exc:
            raise LocalActionsError(str(exc)) from exc
        if os.geteuid() == 0:
            log.warning("the forwarder runs as root, so its hooks do: run it as its own user")
    try:
        journal = Journal(state_dir)
    except JournalError as exc:
        raise LocalActionsError(f"hook journal: {exc}") from exc
    store = LocalStore(journal)
    preparations = Preparations(store, deliver)
    hooks = HookWorker(hooks_file, store, preparations, base_env=base_env) if hooks_file else None
    probe: DrainProbe | None = None
    if settings.probe_port is not None:
        probe = DrainProbe(
            settings.impact,
            settings.drain_seconds,
            preparations=preparations,
            upstream=settings.probe_upstream,
            max_unhealthy=settings.probe_max_unhealthy,
            min_healthy=settings.probe_min_healthy,
        )
        try:
            address, port = probe.bind(settings.probe_address, settings.probe_port)
        except ProbeError as exc:
            journal.close()
            raise LocalActionsError(str(exc)) from exc
        log.info("drain probe listening on %s:%d", address, port)
    preparations.preparers = [p for p in (hooks, probe) if p is not None]
    if hooks_file is not None:
        log.info("hooks: %s", hooks_file.describe())
    log.info("drain moments: lead per event type %s", settings.leads.describe())
    return LocalActions(store, preparations, hooks, probe, leads=settings.leads)
