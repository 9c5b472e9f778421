"""What the local actions know, in memory, and its durable mirror (the journal).

The local actions follow IMDS whatever the disk does: every change is made here, in memory,
first (the view of the events, the hook runs, the preparations), marked *dirty*, and then
:meth:`LocalStore.flush` writes everything dirty in one journal transaction. When the journal
cannot be written (a full disk), nothing is lost from memory and nothing waits on the disk: the
probe still drains and the hooks still run (unrecorded, so at least once), and the dirty items
stay dirty, so the first flush that succeeds writes the whole current state at once (level,
not edge). A crash while behind restarts from the older journal: the transitions since are
derived again with the same ids and their hooks run again (at least once), never lost.

One lock (:attr:`LocalStore.lock`, re-entrant) guards the memory; the poller holds it while it
applies a document and flushes, so that no flush from another thread (a hook that ended) can
write half of what one document called for.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from sebridge.contract.events import ContractError, Observer
from sebridge.forwarder.local.journal import (
    MAX_FINISHED,
    MAX_PREPARATIONS,
    Journal,
    JournalError,
    Preparation,
    Run,
)
from sebridge.forwarder.observability.health import ConditionLog
from sebridge.forwarder.state import MAX_LIVES, ForwarderState
from sebridge.imds import InvalidDocument, ScheduledEvent
from sebridge.lifecycle import Life
from sebridge.times import shifted
from sebridge.timing import MAX_RECENT

log = logging.getLogger("forwarder.local")


def _time(value: object, name: str) -> datetime:
    """An aware time written by :func:`_time_text`; ValueError for anything else."""
    if not isinstance(value, str) or len(value) > 64:
        raise ValueError(f"{name} is not a time")
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        raise ValueError(f"{name} has no time zone")
    try:
        return moment.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"{name} is out of range") from exc


def _optional_time(value: object, name: str) -> datetime | None:
    return None if value is None else _time(value, name)


def _time_text(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


@dataclass(frozen=True)
class Timing:
    """When the local actions act on one event (:mod:`sebridge.timing`), kept with the view so
    that a restart loses no pending moment and moves no moment that has passed."""

    first_seen: datetime  # the document that first showed the event (in this appearance)
    fired: datetime | None = None  # the drain moment, once it passed: never moved again
    probe_from: datetime | None = None  # when the probe's 503 began: never moved again
    # The Scheduled/Updated (message id, transition) whose prepare hooks wait for the moment.
    prepare: tuple[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "firstSeen": _time_text(self.first_seen),
            "fired": _time_text(self.fired),
            "probeFrom": _time_text(self.probe_from),
            "prepare": list(self.prepare) if self.prepare else None,
        }

    @classmethod
    def from_json(cls, obj: object) -> Timing:
        """Strict: ValueError for a damaged record."""
        if not isinstance(obj, dict):
            raise ValueError("a timing is not an object")
        prepare = obj.get("prepare")
        if prepare is not None and not (
            isinstance(prepare, list)
            and len(prepare) == 2
            and all(isinstance(part, str) and part for part in prepare)
        ):
            raise ValueError("a timing's prepare is not [message id, transition]")
        return cls(
            _time(obj.get("firstSeen"), "firstSeen"),
            _optional_time(obj.get("fired"), "fired"),
            _optional_time(obj.get("probeFrom"), "probeFrom"),
            (prepare[0], prepare[1]) if prepare else None,
        )


MAX_UNJUDGED = 200  # transitions kept to judge again once this VM's identity resolves


@dataclass(frozen=True)
class Unjudged:
    """A transition the local actions judged by a fallback name (the host name: this VM's
    identity was not known yet), kept to be judged again when it is."""

    transition: str
    message_id: str
    event: ScheduledEvent
    incarnation: int | None = None
    # When the document showing it was read, and (a Scheduled or Updated) the event's drain
    # moment as it stood then: the re-judging replays whether a revision's moment came while
    # it was current. None in a record from before they were kept.
    at: datetime | None = None
    moment: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "transition": self.transition,
            "messageId": self.message_id,
            "event": self.event.to_imds(),
            "incarnation": self.incarnation,
            "at": _time_text(self.at),
            "moment": _time_text(self.moment),
        }

    @classmethod
    def from_json(cls, obj: object) -> Unjudged | None:
        """Tolerant: None for a damaged record (it is not judged again, nothing else is lost)."""
        if not isinstance(obj, dict):
            return None
        transition, message_id = obj.get("transition"), obj.get("messageId")
        incarnation = obj.get("incarnation")
        if not (isinstance(transition, str) and isinstance(message_id, str) and message_id):
            return None
        try:
            event = ScheduledEvent.from_imds(obj.get("event"), strict=False)
        except (InvalidDocument, TypeError, ValueError):
            return None
        if isinstance(incarnation, bool) or not isinstance(incarnation, int):
            incarnation = None
        return cls(
            transition,
            message_id,
            event,
            incarnation,
            _lenient_time(obj.get("at")),
            _lenient_time(obj.get("moment")),
        )


def _lenient_time(value: object) -> datetime | None:
    """A time of the view that may be missing or damaged without the rest being lost."""
    try:
        return None if value is None else _time(value, "a time")
    except ValueError:
        return None


def _lenient_reading(value: object) -> float | None:
    """A monotonic clock's reading that may be missing or damaged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    reading = float(value)
    return reading if math.isfinite(reading) and abs(reading) < 1e15 else None


def _lenient_boot(value: object) -> str | None:
    """A boot id (the kernel's, 36 characters) that may be missing or damaged."""
    return value if isinstance(value, str) and 0 < len(value) <= 64 else None


@dataclass(frozen=True)
class ClockPair:
    """The wall and monotonic clocks read together as the view was written, and the boot
    (the kernel's boot id) the monotonic clock counts in: at the next start in the same boot,
    how far the wall clock moved meanwhile besides the time that passed."""

    wall: datetime
    mono: float
    boot: str

    def to_json(self) -> dict[str, Any]:
        return {"wall": _time_text(self.wall), "mono": self.mono, "boot": self.boot}

    @classmethod
    def from_json(cls, obj: object) -> ClockPair | None:
        """Tolerant: None for anything damaged."""
        if not isinstance(obj, dict):
            return None
        wall, mono, boot = (
            _lenient_time(obj.get("wall")),
            _lenient_reading(obj.get("mono")),
            _lenient_boot(obj.get("boot")),
        )
        if wall is None or mono is None or boot is None:
            return None
        return cls(wall, mono, boot)


@dataclass(frozen=True)
class Gone:
    """An event IMDS left out of a document lately: when, its timing, and whether it held the
    drain probe at 503 then (an event of this VM that had not started)."""

    at: datetime
    timing: Timing
    drained: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "goneAt": _time_text(self.at),
            "timing": self.timing.to_json(),
            "drained": self.drained,
        }


def _recent(raw: object) -> dict[str, Gone]:
    """Tolerant: the entries that read (none in a journal from before they were kept); a
    damaged one is dropped, and its event, should it come back, starts afresh."""
    out: dict[str, Gone] = {}
    for key, entry in raw.items() if isinstance(raw, dict) else ():
        if len(out) >= MAX_RECENT or not isinstance(entry, dict):
            continue
        try:
            gone = Gone(
                _time(entry.get("goneAt"), "goneAt"),
                Timing.from_json(entry.get("timing")),
                entry.get("drained") is True,
            )
        except ValueError:
            continue
        out[str(key)] = gone
    return out


@dataclass
class View:
    """The local actions' own view of the events: what the next document is diffed against
    (the same diff and message ids as the forwarder's, :mod:`sebridge.lifecycle`), and when to
    act on each event (``timing``, for the events of the last document)."""

    events: dict[str, ScheduledEvent] = field(default_factory=dict)
    lives: dict[str, Life] = field(default_factory=dict)
    observed_at: datetime | None = None
    incarnation: int | None = None
    observer: Observer | None = None  # this VM, as the last document was observed by
    timing: dict[str, Timing] = field(default_factory=dict)
    # The transitions judged by a fallback name since the last judgment by this VM's identity,
    # oldest first, at most MAX_UNJUDGED: judged again, in order, when the identity resolves.
    unjudged: tuple[Unjudged, ...] = ()
    # The timing of events IMDS left out of a document lately, by key: (when they went, their
    # timing), oldest first, at most MAX_RECENT (sebridge.timing): one that comes back keeps
    # its timing, across a restart too.
    recent: dict[str, Gone] = field(default_factory=dict)
    # When the drain probe last stopped answering 503 (a run's end, a started event's end):
    # after a restart, the healthy gap counts from it.
    probe_healthy_since: datetime | None = None
    # When it last began answering 503: a drain's time counts from then at the earliest.
    probe_unhealthy_since: datetime | None = None
    # When the forwarder last started; since when the balancer may not have seen the drain
    # probe healthy for the gap (that start, or the first of the starts in a row between which
    # the probe never answered 200 for the gap: each was refused while the process was down);
    # and when, since that start, the probe had answered 200 for the gap (None: not yet). A run
    # of 503 that begins before then counts its bound from dark_since.
    started_at: datetime | None = None
    dark_since: datetime | None = None
    seen_healthy: datetime | None = None
    # dark_since on the monotonic clock, and the boot it counts in (the kernel's boot id): a
    # start in the same boot places it by that clock, which no step of the wall clock moves.
    dark_mono: float | None = None
    boot: str | None = None
    clock: ClockPair | None = None  # stamped as the view is written

    def moved(self, step: timedelta) -> View:
        """This view with every time it keeps moved by ``step`` (the wall clock moved that much
        more than the time that passed): each stands where it stood, on today's wall clock.
        The events' own times (NotBefore) are Azure's and stay, and so do the drain moments
        kept for the re-judging that were still to come."""

        def move(moment: datetime | None) -> datetime | None:
            return None if moment is None else shifted(moment, step)

        def timing(kept: Timing) -> Timing:
            return replace(
                kept,
                first_seen=shifted(kept.first_seen, step),
                fired=move(kept.fired),
                probe_from=move(kept.probe_from),
            )

        def unjudged(item: Unjudged) -> Unjudged:
            # A moment that had come when the record was seen (this VM's first sight, or a
            # NotBefore passed: either way by ``at``) moves with it; one to come is NotBefore's.
            came = item.moment is not None and item.at is not None and item.moment <= item.at
            return replace(
                item, at=move(item.at), moment=move(item.moment) if came else item.moment
            )

        return replace(
            self,
            observed_at=move(self.observed_at),
            timing={key: timing(kept) for key, kept in self.timing.items()},
            unjudged=tuple(unjudged(item) for item in self.unjudged),
            recent={
                key: replace(gone, at=shifted(gone.at, step), timing=timing(gone.timing))
                for key, gone in self.recent.items()
            },
            probe_healthy_since=move(self.probe_healthy_since),
            probe_unhealthy_since=move(self.probe_unhealthy_since),
            started_at=move(self.started_at),
            dark_since=move(self.dark_since),
            seen_healthy=move(self.seen_healthy),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "observer": self.observer.to_data() if self.observer else None,
            "incarnation": self.incarnation,
            "observedAt": self.observed_at.isoformat() if self.observed_at else None,
            "events": [event.to_imds() for event in self.events.values()],
            "lives": {key: life.to_json() for key, life in self.lives.items()},
            "timing": {key: timing.to_json() for key, timing in self.timing.items()},
            "unjudged": [item.to_json() for item in self.unjudged],
            "probeHealthySince": _time_text(self.probe_healthy_since),
            "probeUnhealthySince": _time_text(self.probe_unhealthy_since),
            "startedAt": _time_text(self.started_at),
            "darkSince": _time_text(self.dark_since),
            "seenHealthy": _time_text(self.seen_healthy),
            "darkMono": self.dark_mono,
            "boot": self.boot,
            "clock": self.clock.to_json() if self.clock else None,
            "recent": {key: gone.to_json() for key, gone in self.recent.items()},
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> View:
        """Strict: a damaged view raises ValueError (the caller starts afresh)."""
        incarnation = obj.get("incarnation")
        if incarnation is not None and (
            isinstance(incarnation, bool) or not isinstance(incarnation, int)
        ):
            raise ValueError("incarnation is not an integer")
        raw_events = obj.get("events")
        raw_lives = obj.get("lives")
        raw_timing = obj.get("timing", {})  # none in a journal from before issue 24
        if not isinstance(raw_events, list) or not isinstance(raw_lives, dict):
            raise ValueError("events or lives missing")
        if len(raw_lives) > 10 * MAX_LIVES:
            raise ValueError("lives is larger than expected")
        if not isinstance(raw_timing, dict) or len(raw_timing) > len(raw_events):
            raise ValueError("timing is not an object of the events")
        try:
            events = [ScheduledEvent.from_imds(raw, strict=False) for raw in raw_events]
        except InvalidDocument as exc:
            raise ValueError(str(exc)) from exc
        observed_at = None
        text = obj.get("observedAt")
        if isinstance(text, str) and len(text) <= 64:
            try:
                moment = datetime.fromisoformat(text)
                observed_at = moment.astimezone(UTC) if moment.tzinfo else None
            except (ValueError, OverflowError):
                observed_at = None
        observer_data = obj.get("observer")
        try:
            observer = (
                Observer.from_data(observer_data) if isinstance(observer_data, dict) else None
            )
        except ContractError:
            observer = None
        by_key = {event.key: event for event in events}
        raw_unjudged = obj.get("unjudged")  # none in a journal from before it was kept
        unjudged = tuple(
            item
            for raw in (raw_unjudged if isinstance(raw_unjudged, list) else [])[-MAX_UNJUDGED:]
            if (item := Unjudged.from_json(raw)) is not None
        )
        return cls(
            events=by_key,
            lives={str(key): Life.from_json(life) for key, life in raw_lives.items()},
            observed_at=observed_at,
            incarnation=incarnation,
            observer=observer,
            timing={
                str(key): Timing.from_json(timing)
                for key, timing in raw_timing.items()
                if key in by_key
            },
            unjudged=unjudged,
            recent=_recent(obj.get("recent")),
            probe_healthy_since=_lenient_time(obj.get("probeHealthySince")),
            probe_unhealthy_since=_lenient_time(obj.get("probeUnhealthySince")),
            started_at=_lenient_time(obj.get("startedAt")),
            dark_since=_lenient_time(obj.get("darkSince")),
            seen_healthy=_lenient_time(obj.get("seenHealthy")),
            dark_mono=_lenient_reading(obj.get("darkMono")),
            boot=_lenient_boot(obj.get("boot")),
            clock=ClockPair.from_json(obj.get("clock")),
        )

    @classmethod
    def of(cls, state: ForwarderState) -> View:
        """The forwarder's own state as a view (a journal from before views were kept)."""
        return cls(dict(state.events), dict(state.lives), state.observed_at, state.incarnation)


class LocalStore:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.lock = threading.RLock()
        self.view = View()
        self.runs: dict[tuple[str, str], Run] = {}  # in the order first recorded
        self.preparations: dict[str, Preparation] = {}
        self._view_dirty = False
        self._dirty_runs: set[tuple[str, str]] = set()
        self._dirty_preparations: set[str] = set()
        self.behind_since: datetime | None = None  # the journal could not be written since
        self.flush_failures = 0
        self.views_written = 0  # how many times the view reached the journal (diagnostics)
        self._log = ConditionLog(log, logging.ERROR)
        # Reads the clocks as the view is written (ClockPair); None: not stamped.
        self.clock: Callable[[], ClockPair | None] | None = None

    # -- start -------------------------------------------------------------------------------
    def load(self) -> bool:
        """Read the journal (at start); False when it holds no view yet (a first start, or a
        journal from before views were kept). A journal that cannot be read starts empty."""
        try:
            snapshot = self.journal.load()
        except JournalError as exc:
            log.error("cannot read the local actions' journal (%s): starting empty", exc)
            return False
        with self.lock:
            self.runs = {run.key: run for run in snapshot.runs}
            self.preparations = {p.event_key: p for p in snapshot.preparations}
            if snapshot.view is None:
                return False
            try:
                self.view = View.from_json(snapshot.view)
            except ValueError as exc:
                log.error("the local actions' view is damaged (%s): started afresh", exc)
                return False
        return True

    # -- changes (in memory; flushed by flush) -----------------------------------------------
    def set_view(self, view: View, *, persist: bool = True) -> None:
        with self.lock:
            self.view = view
            self._view_dirty = self._view_dirty or persist

    def add_runs(self, runs: Iterable[Run]) -> list[Run]:
        """Record ``runs`` as pending; returns those that are new (a run already known, running
        or finished, is never queued twice)."""
        new = []
        with self.lock:
            for run in runs:
                if run.key in self.runs:
                    continue
                self.runs[run.key] = run
                self._dirty_runs.add(run.key)
                new.append(run)
        return new

    def update_run(self, run: Run) -> None:
        with self.lock:
            if run.key not in self.runs:
                return  # forgotten meanwhile (bounded): nothing to record
            self.runs[run.key] = run
            self._dirty_runs.add(run.key)
            self._bound_runs()

    def run(self, key: tuple[str, str]) -> Run | None:
        with self.lock:
            return self.runs.get(key)

    def deferred_prepare(self, event_key: str) -> str | None:
        """The message id of the Scheduled/Updated whose prepare hooks wait for the event's
        drain moment (None: none wait)."""
        with self.lock:
            timing = self.view.timing.get(event_key)
            return timing.prepare[0] if timing is not None and timing.prepare else None

    def unfinished(self) -> list[Run]:
        with self.lock:
            return [run for run in self.runs.values() if not run.finished]

    def set_preparation(self, preparation: Preparation) -> None:
        with self.lock:
            self.preparations[preparation.event_key] = preparation
            self._dirty_preparations.add(preparation.event_key)
            self._bound_preparations()

    def preparation(self, event_key: str) -> Preparation | None:
        with self.lock:
            return self.preparations.get(event_key)

    def open_preparations(self) -> list[Preparation]:
        with self.lock:
            return [p for p in self.preparations.values() if not p.ended]

    def _bound_runs(self) -> None:
        finished = [key for key, run in self.runs.items() if run.finished]
        for key in finished[: max(0, len(finished) - MAX_FINISHED)]:
            del self.runs[key]
            self._dirty_runs.discard(key)

    def _bound_preparations(self) -> None:
        ended = [key for key, p in self.preparations.items() if p.ended]
        for key in ended[: max(0, len(ended) - MAX_PREPARATIONS)]:
            del self.preparations[key]
            self._dirty_preparations.discard(key)

    # -- the journal ---------------------------------------------------------------------------
    @property
    def dirty(self) -> bool:
        with self.lock:
            return self._view_dirty or bool(self._dirty_runs or self._dirty_preparations)

    def _stamped(self) -> View:
        """The view as written: with the clocks read now."""
        if self.clock is None:
            return self.view
        pair = self.clock()  # first: it may move the view (a step of the wall clock)
        return replace(self.view, clock=pair)

    def persist_view(self) -> None:
        """Write the view at the next flush even if no event changed (at stop: a restart then
        measures its observation gap from the last poll, as the forwarder's state does)."""
        with self.lock:
            self._view_dirty = True

    def flush(self) -> bool:
        """Write everything dirty in one journal transaction. True when the journal holds what
        memory holds; False (logged once while it lasts) when it could not be written: it all
        stays dirty and goes with the next flush."""
        with self.lock:
            if not self.dirty:
                return True
            runs = [self.runs[key] for key in self.runs if key in self._dirty_runs]
            preparations = [
                self.preparations[key]
                for key in self.preparations
                if key in self._dirty_preparations
            ]
            try:
                self.journal.commit(
                    view=self._stamped().to_json() if self._view_dirty else None,
                    runs=runs,
                    preparations=preparations,
                )
            except JournalError as exc:
                self.flush_failures += 1
                if self.behind_since is None:
                    self.behind_since = datetime.now(UTC)
                self._log.report(
                    f"cannot write the local actions' journal ({exc}): the probe and the hooks "
                    "go on from memory (a hook may run again after a crash); the whole current "
                    "state is written at the first flush that succeeds"
                )
                return False
            if self._view_dirty:
                self.views_written += 1
            self._view_dirty = False
            self._dirty_runs.clear()
            self._dirty_preparations.clear()
            if self.behind_since is not None:
                self._log.clear(
                    f"local actions' journal written again after {self.flush_failures} failed "
                    "attempt(s): it holds the whole current state"
                )
                self.behind_since = None
                self.flush_failures = 0
            return True
