"""When to act on a scheduled event: the drain moment and the drain probe's bound (pure).

Capacity is lost from the moment a VM drains, so the bridge drains (the forwarder's drain probe,
lb-pools) and runs the prepare hooks as late as is safe: at the event's **drain moment**,
``NotBefore`` minus a **lead** per event type. Both sides read the rule from here, so the VM
and the Function App never disagree about when "prepare" starts:

- the forwarder: ``--drain-lead "Reboot=300,Freeze=120"`` (:func:`parse_leads`);
- the approval policy (part B): ``{"leadSeconds": {"Reboot": 300, "Freeze": 120}}``
  (:func:`leads_from_json`).

A lead is whole or fractional seconds (0 to :data:`MAX_LEAD_SECONDS`) or ``first-sight``: act
as soon as the event is seen. What is not listed keeps its default (:data:`DEFAULT_LEADS`):
Preempt and Terminate at first sight (their notice is 30 s and a few minutes: nothing to gain),
Reboot and Redeploy 5 minutes before NotBefore, Freeze 2 minutes; an event type IMDS may add
later is acted on at first sight.

:func:`drain_moment`: first sight for an event already Started, without a readable NotBefore,
of a first-sight type, or whose notice is shorter than its lead; ``NotBefore - lead``
otherwise. The caller keeps the first-sight time durable and fixes the moment once it has
passed (an Updated never undoes a drain that happened).

The drain probe's bound (:class:`UnhealthyRuns`): a scale set's automatic instance repairs may
watch the same load balancer probe and replace, reimage or restart an instance that stays
unhealthy past its grace period (Azure: 10 to 90 minutes). So for events that have not started
the probe never answers 503 for longer than ``--drain-probe-max-unhealthy-seconds`` at a
stretch (below :data:`REPAIR_GRACE_MINIMUM_SECONDS`, refused at or above it): it begins no
earlier than ``NotBefore - bound`` (:func:`probe_begins`), so that a long lead spends the
bound just before the event rather than far ahead of it, and when a run reaches the bound the
probe answers 200 again until the event starts. A Started event drains regardless.

The API, for each side:

- configuration: :class:`Leads` (``lead(type)``, ``describe()``, ``spelled()``),
  :data:`DEFAULT_LEADS`, :func:`parse_leads` (the flag), :func:`leads_from_json` (the policy),
  :func:`check_probe_bound`; every refusal is a :class:`TimingError` naming the flag or key;
- the moment: :func:`drain_moment` (pure: the caller keeps ``first_seen`` durable, compares the
  moment with its own clock, and keeps a moment that has passed as passed);
- the drain probe only: :func:`probe_begins` and :class:`UnhealthyRuns`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sebridge.imds import ScheduledEvent
from sebridge.impact import KNOWN_EVENT_TYPES
from sebridge.times import shifted

FIRST_SIGHT = "first-sight"  # how a lead of "as soon as the event is seen" is spelled
MAX_LEAD_SECONDS = 7 * 86_400  # Azure "tries to give 7 days" for degraded hardware
DEFAULT_LEAD_SECONDS: Mapping[str, float | None] = {
    "Freeze": 120,
    "Reboot": 300,
    "Redeploy": 300,
    "Preempt": None,  # None: at first sight
    "Terminate": None,
}
# Azure's shortest grace period of automatic instance repairs (automaticRepairsPolicy
# .gracePeriod, PT10M to PT90M; PT10M is also the default in current API versions).
REPAIR_GRACE_MINIMUM_SECONDS = 600
# 90 s under it: the load balancer's view lags the probe by up to interval x threshold.
DEFAULT_PROBE_MAX_UNHEALTHY_SECONDS = 510
# Between two runs of 503 the probe answers 200 at least this long, so that the load balancer
# (and the repairs watching it) see the instance healthy: at least probe interval x threshold
# (Azure Load Balancer: 5 s x 2 by default; Application Gateway: 30 s x 3).
DEFAULT_PROBE_MIN_HEALTHY_SECONDS = 90
MAX_PROBE_MIN_HEALTHY_SECONDS = 3600
# A drain that goes away keeps its begin and whether it spent the bound this long (IMDS may
# leave an event out of one document), for at most this many drains.
RECENT_SECONDS = 600
MAX_RECENT = 64
EARLIEST_WALL = datetime(1970, 1, 1, tzinfo=UTC)  # the origin of the wall clock's seconds


class TimingError(ValueError):
    """A lead or a bound is not usable; the message says which and why."""


@dataclass(frozen=True)
class Leads:
    """The lead per event type (keys as in :data:`KNOWN_EVENT_TYPES`; None: at first sight)."""

    seconds: Mapping[str, float | None] = field(default_factory=lambda: dict(DEFAULT_LEAD_SECONDS))

    def lead(self, event_type: str) -> float | None:
        """Seconds before NotBefore, or None (at first sight: also any type not known)."""
        wanted = event_type.strip().lower()
        for name, value in self.seconds.items():
            if name.lower() == wanted:
                return value
        return None

    def describe(self) -> dict[str, float | str]:
        """For logs and status: ``{"Reboot": 300, "Preempt": "first-sight", ...}``."""
        return {
            name: FIRST_SIGHT if value is None else _number_text(value)
            for name, value in self.seconds.items()
        }

    def spelled(self) -> str:
        """The flag's spelling of these leads (``Reboot=300,...``)."""
        return ",".join(f"{name}={value}" for name, value in self.describe().items())


def _number_text(value: float) -> float:
    return int(value) if float(value).is_integer() else value


DEFAULT_LEADS = Leads()


def _lead_value(where: str, value: object) -> float | None:
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == FIRST_SIGHT:
            return None
        try:
            number = float(text)
        except ValueError:
            raise TimingError(
                f"{where}: {value!r} is not a number of seconds or {FIRST_SIGHT!r}"
            ) from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TimingError(f"{where}: {value!r} is not a number of seconds or {FIRST_SIGHT!r}")
    else:
        number = float(value)
    if not math.isfinite(number) or not 0 <= number <= MAX_LEAD_SECONDS:
        raise TimingError(
            f"{where}: {value!r} must be between 0 and {MAX_LEAD_SECONDS} seconds "
            f"(7 days), or {FIRST_SIGHT!r}"
        )
    return number


def _event_type(where: str, name: object) -> str:
    known = {t.lower(): t for t in KNOWN_EVENT_TYPES}
    if not isinstance(name, str) or name.strip().lower() not in known:
        raise TimingError(
            f"{where}: unknown event type {name!r} (known: {', '.join(KNOWN_EVENT_TYPES)})"
        )
    return known[name.strip().lower()]


def leads_from_mapping(
    values: Mapping[Any, Any], *, where: str, base: Leads = DEFAULT_LEADS
) -> Leads:
    """``base`` with the leads in ``values`` (event type -> seconds or ``first-sight``)."""
    out = dict(base.seconds)
    seen: set[str] = set()
    for name, value in values.items():
        event_type = _event_type(where, name)
        if event_type in seen:
            raise TimingError(f"{where}: {event_type} is given twice")
        seen.add(event_type)
        out[event_type] = _lead_value(f"{where} {event_type}", value)
    return Leads(out)


def parse_leads(text: str, *, where: str = "--drain-lead", base: Leads = DEFAULT_LEADS) -> Leads:
    """``Reboot=300,Freeze=first-sight``: the listed types change, the others keep ``base``.
    Empty: ``base``. Raises :class:`TimingError` naming ``where``."""
    values: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise TimingError(
                f"{where}: {part.strip()!r} is not TYPE=SECONDS or TYPE={FIRST_SIGHT} "
                "(e.g. Reboot=300,Freeze=120)"
            )
        if name.strip() in values:
            raise TimingError(f"{where}: {name.strip()} is given twice")
        values[name.strip()] = value
    return leads_from_mapping(values, where=where, base=base)


def leads_from_json(
    obj: object, *, where: str = "leadSeconds", base: Leads = DEFAULT_LEADS
) -> Leads:
    """The JSON spelling (``{"Reboot": 300, "Preempt": "first-sight"}``); None: ``base``."""
    if obj is None:
        return base
    if not isinstance(obj, Mapping):
        raise TimingError(f"{where}: must be an object of event type to seconds")
    return leads_from_mapping(obj, where=where, base=base)


def drain_moment(event: ScheduledEvent, first_seen: datetime, leads: Leads) -> datetime:
    """When to drain and prepare for ``event``, first seen at ``first_seen``: at first sight
    for a Started event, an unknown NotBefore, a first-sight type or a notice shorter than the
    lead; ``NotBefore - lead`` otherwise. Never earlier than ``first_seen``."""
    if event.is_started or event.not_before is None:
        return first_seen
    lead = leads.lead(event.event_type)
    if lead is None:
        return first_seen
    return max(first_seen, shifted(event.not_before, -lead))


def check_probe_bound(
    seconds: float, *, where: str = "--drain-probe-max-unhealthy-seconds"
) -> float:
    """A bound the probe may answer 503 for at a stretch: above 0, below Azure's shortest
    automatic-repairs grace period. Raises :class:`TimingError`."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise TimingError(f"{where} must be more than 0 seconds")
    if seconds >= REPAIR_GRACE_MINIMUM_SECONDS:
        raise TimingError(
            f"{where} must be below {REPAIR_GRACE_MINIMUM_SECONDS} seconds (10 minutes, the "
            "shortest grace period of a scale set's automatic instance repairs): a probe "
            "unhealthy that long can get the instance replaced, reimaged or restarted"
        )
    return seconds


def check_min_healthy(seconds: float, *, where: str = "--drain-probe-min-healthy-seconds") -> float:
    """How long the probe answers 200 between two runs of 503: at least 0 (0: no gap), at most
    :data:`MAX_PROBE_MIN_HEALTHY_SECONDS`. Raises :class:`TimingError`."""
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_PROBE_MIN_HEALTHY_SECONDS:
        raise TimingError(f"{where} must be between 0 and {MAX_PROBE_MIN_HEALTHY_SECONDS} seconds")
    return seconds


def probe_begins(event: ScheduledEvent, moment: datetime, bound: timedelta) -> datetime:
    """When the drain probe starts answering 503 for ``event`` (not started): at its drain
    moment, but no earlier than ``NotBefore - bound``, so the bounded run ends at NotBefore."""
    if event.not_before is None:
        return moment
    return max(moment, shifted(event.not_before, -bound))


class UnhealthyRuns:
    """The drain probe's runs of 503 for events that have not started, as the load balancer
    and automatic repairs see them (pure: the caller says what begins when, and the clocks).

    Each drain of a not-started event holds the probe at 503 from its begin time. A run starts
    when the probe goes from 200 to 503 and lasts at most ``bound``: every drain that began
    within a run that reached the bound is *spent* (the probe answers 200 for it until the
    event starts, when the caller drains regardless).

    What the balancer sees is the probe sampled every few seconds, a change counted only after
    a few samples in a row (interval x threshold). So:

    - after a run, and after any 503 (a started event's), the probe answers 200 for at least
      ``min_healthy`` before a new run starts: a drain that begins sooner waits for it;
    - a run whose drains all went away (an event left out of one document) and whose drains
      come back within ``min_healthy`` goes on as the same run (the balancer may never have
      seen the 200): its time counts, and a drain keeps its begin and whether it is spent for
      :data:`RECENT_SECONDS` after it was last seen (at most :data:`MAX_RECENT` of them);
    - runs are measured on the monotonic clock (``mono``, seconds): a drain's begin is placed
      on it once, when it begins, so a step of the wall clock neither stretches nor cuts a run;
    - while the process was down the balancer saw the probe refused, as unhealthy, and until
      the probe has answered 200 for ``min_healthy`` after a start it may not have seen it
      healthy since: a run that starts before then counts its bound from that start, or from
      the first of the starts in a row between which it never had (:meth:`came_up`); it still
      starts at once, and only ends sooner. When that would leave it less than the gap (a run
      the balancer might not see: restarts in a row for about the bound or longer), it counts
      from its own start: a drain is never put off, nor cut to nothing.

    Replaying from the begin times alone gives the same runs, so a restart that recomputes the
    begin times from durable data continues a run that was going on; what replay cannot give
    back (when the probe was last 503: a started event's, a run cut short) comes from the
    caller, who keeps when the probe last stopped answering 503 (:meth:`restarted`)."""

    def __init__(self, bound: timedelta, min_healthy: timedelta = timedelta(0)) -> None:
        self.bound = bound
        self.min_healthy = min_healthy
        self.spent: set[str] = set()
        self._start: float | None = None  # the current run's start (monotonic)
        self._from: float | None = None  # what the current run's bound counts from (monotonic)
        self._held: float | None = None  # since when the current run has held the probe at 503
        self._resumable_from: float | None = None  # ...and that of a run cut short
        # Since when the balancer may not have seen the probe healthy for the gap, until it
        # has since this process came up (None: it has); when this process came up.
        self._dark: float | None = None
        self._came_up: float | None = None
        self._ended: float | None = None  # when the probe was last 503 (monotonic)
        self._resumable: float | None = None  # the start of a run cut short, not by the bound
        self._pinned: dict[str, float] = {}  # a drain's begin (monotonic), once it began
        self._seen: dict[str, float] = {}  # when each known drain was last given (monotonic)
        self._now = (datetime.min, 0.0)  # the last (wall, monotonic) reading
        self._answered_200: float | None = None  # the last reading no drain held (monotonic)

    def _wall(self, mono: float) -> datetime:
        wall, at = self._now
        return shifted(wall, mono - at)

    @property
    def held_since(self) -> datetime | None:
        """Since when the current run has held the probe at 503 without a break (None: no run),
        on the wall clock of the last call: what a drain's time counts from."""
        if self._start is None:
            return None
        return self._wall(self._start if self._held is None else self._held)

    @property
    def run_start(self) -> datetime | None:
        """When the current run started (None: no run), on the wall clock of the last call."""
        return None if self._start is None else self._wall(self._start)

    def _forget(self, present: set[str], mono: float) -> None:
        for key in present:
            self._seen[key] = mono
        recent = sorted(self._seen.items(), key=lambda item: item[1], reverse=True)
        keep = {
            key
            for index, (key, seen) in enumerate(recent)
            if key in present or (index < MAX_RECENT and mono - seen <= RECENT_SECONDS)
        }
        self._seen = {key: seen for key, seen in self._seen.items() if key in keep}
        self._pinned = {key: at for key, at in self._pinned.items() if key in keep}
        self.spent &= keep

    def holding(
        self,
        begins: Mapping[str, datetime],
        now: datetime,
        mono: float | None = None,
        *,
        forced: bool = False,
    ) -> set[str]:
        """The drains that hold the probe at 503 at ``now`` (empty: they leave it at 200);
        ``begins`` holds every current drain of a not-started event, by key; ``mono`` is the
        monotonic clock's reading at ``now`` (None: the wall clock's); ``forced``: the probe
        answers 503 anyway (a started event)."""
        if mono is None:
            mono = (now - EARLIEST_WALL).total_seconds()
        self._now = (now, mono)
        bound = self.bound.total_seconds()
        gap = self.min_healthy.total_seconds()
        self._forget(set(begins), mono)
        at: dict[str, float] = {}
        for key, begin in begins.items():
            pinned = self._pinned.get(key)
            if pinned is None:
                pinned = mono - (now - begin).total_seconds()
                if pinned <= mono:
                    self._pinned[key] = pinned  # placed on the monotonic clock once begun
            at[key] = pinned
        answered_200 = self._answered_200  # the last reading that found no drain holding
        while True:
            active = {k for k, begin in at.items() if k not in self.spent and begin <= mono}
            if not active:
                if self._start is not None:  # cut short (its drains went away): may go on
                    self._resumable, self._start, self._ended = self._start, None, mono
                    self._resumable_from, self._from = self._from, None
                if forced:
                    self._ended = mono
                else:
                    self._answered_200 = mono
                    self._see_healthy(mono)
                return set()
            if self._start is None:
                start = min(at[k] for k in active)
                resumed = False
                if self._ended is not None and start < self._ended + gap:
                    if self._resumable is not None and mono < self._ended + gap:
                        start = self._resumable  # back before the balancer saw it healthy
                        resumed = True
                    else:
                        start = self._ended + gap
                if not resumed and answered_200 is not None:
                    # A new run never starts before the probe last answered 200: a drain that
                    # comes back with an old begin (left out longer than the gap) gets its run
                    # from now, not one already partly or wholly spent in the past.
                    start = max(start, answered_200)
                bound_from = self._resumable_from if resumed else None
                if bound_from is None:
                    bound_from = self._counted_from(start)
                if mono < start:
                    if forced:
                        self._ended = mono
                    else:
                        self._see_healthy(mono)
                    return set()
                self._start, self._from, self._resumable = start, bound_from, None
                # A run that goes on after the probe answered 200 (its drains went away and
                # came back) has held it at 503 again only since now: the balancer may have
                # taken the VM back meanwhile.
                self._held = mono if resumed else start
                self._resumable_from = None
            end = (self._from if self._from is not None else self._start) + bound
            if mono < end:
                self._ended = mono
                return active
            self.spent |= {k for k in active if at[k] <= end}
            self._start, self._resumable, self._ended = None, None, end
            self._from = self._resumable_from = None

    def _healthy_from(self) -> float | None:
        """(In the dark.) Since when the probe has answered 200 after this process came up."""
        if self._came_up is None:
            return None
        return self._came_up if self._ended is None else max(self._came_up, self._ended)

    def _see_healthy(self, mono: float) -> None:
        """The probe answers 200 at ``mono``: out of the dark once it has for the gap."""
        healthy_from = self._healthy_from()
        if healthy_from is not None and mono - healthy_from >= self.min_healthy.total_seconds():
            self._dark = None

    @property
    def in_the_dark(self) -> bool:
        """Whether the balancer may not have seen the probe healthy for the gap since this
        process came up (or the first of the starts in a row before it)."""
        return self._dark is not None

    def _counted_from(self, start: float) -> float:
        """What the bound of a new run that starts at ``start`` counts from: its start, or,
        before the balancer can have seen the probe healthy for the gap since it came up,
        since when it has not (unless that leaves the run less than the gap)."""
        healthy_from = self._healthy_from()
        if self._dark is None or healthy_from is None or start < self._dark:
            return start
        if start >= healthy_from + self.min_healthy.total_seconds():
            return start
        left = self._dark + self.bound.total_seconds() - start
        # A run left shorter than the gap might not be seen by the balancer at all (a drain
        # lost, not bounded): it counts from its own start, as after a crash loop.
        return self._dark if left >= self.min_healthy.total_seconds() else start

    def came_up(
        self,
        dark_since: datetime | None,
        now: datetime,
        mono: float | None = None,
        *,
        dark_mono: float | None = None,
    ) -> None:
        """The process came up at ``now``; ``dark_since``: since when the balancer may not have
        seen the probe healthy for the gap (this start, or the first of the starts in a row
        between which the probe never answered 200 for the gap), on the wall clock; None: no
        such time (no gap); ``dark_mono``: the same time on the monotonic clock of ``mono``, when
        known (a start in the same boot), which no step of the wall clock moves. Call before
        the first :meth:`holding`, so that the replay of a run begun after that time counts as
        it did."""
        if mono is None:
            mono = (now - EARLIEST_WALL).total_seconds()
        self._came_up = mono
        self._dark = None
        if dark_since is not None and self.min_healthy > timedelta(0):
            placed = mono - (now - dark_since).total_seconds()
            self._dark = min(mono, placed if dark_mono is None else dark_mono)

    def held_at_least_since(self, since: datetime) -> None:
        """(After a restart's replay.) The probe answered 503 without a break only since
        ``since``: a run going on has held it since then at the earliest."""
        if self._start is None:
            return
        wall, mono = self._now
        placed = mono - (wall - since).total_seconds()
        held = self._start if self._held is None else self._held
        if held < placed <= mono:
            self._held = placed

    def restarted(self, healthy_since: datetime) -> None:
        """The process starts again; ``healthy_since``: when the probe last stopped answering
        503 before (kept durably by the caller), which a fresh instance does not know. Unless
        the replay from the durable begin times shows a run going on (it goes on, its bound
        counted as before), a new run waits ``min_healthy`` from then; a run the replay
        shows cut short may go on, as without a restart; a "run" the replay shows beginning
        within the gap after then was a drain the gap held back: it waits too (call after the
        first :meth:`holding`)."""
        wall, mono = self._now
        ended = mono - (wall - healthy_since).total_seconds()
        if self._start is not None:
            if not ended < self._start < ended + self.min_healthy.total_seconds():
                return
            # The replay took a drain that the gap after the last 503 held back for a run
            # going on: no run starts within the gap (a run cut short goes on from before it).
            self._start = self._from = self._held = None
            self._ended = None
        if ended <= mono:
            if ended + self.min_healthy.total_seconds() > mono:
                # Down within the gap: the balancer saw the probe refused, so the gap starts
                # again from the restart.
                ended = mono
            self._ended = ended if self._ended is None else max(self._ended, ended)

    def run_end(self) -> datetime | None:
        """When the current run reaches the bound (None: no run)."""
        if self._start is None:
            return None
        counted_from = self._start if self._from is None else self._from
        return self._wall(counted_from + self.bound.total_seconds())
