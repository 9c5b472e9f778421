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
from datetime import datetime, timedelta
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


def probe_begins(event: ScheduledEvent, moment: datetime, bound: timedelta) -> datetime:
    """When the drain probe starts answering 503 for ``event`` (not started): at its drain
    moment, but no earlier than ``NotBefore - bound``, so the bounded run ends at NotBefore."""
    if event.not_before is None:
        return moment
    return max(moment, shifted(event.not_before, -bound))


class UnhealthyRuns:
    """The drain probe's runs of 503 for events that have not started (pure: the caller says
    what begins when, and the time).

    Each drain of a not-started event holds the probe at 503 from its begin time. A run starts
    when the probe goes from 200 to 503 and lasts at most ``bound``: every drain that began
    within a run that reached the bound is *spent* (the probe answers 200 for it until the
    event starts, when the caller drains regardless). A drain that begins after the run ended
    starts a new run. Replaying from the begin times alone gives the same runs, so a restart
    that recomputes the begin times from durable data continues where it was."""

    def __init__(self, bound: timedelta) -> None:
        self.bound = bound
        self.run_start: datetime | None = None
        self.spent: set[str] = set()

    def holding(self, begins: Mapping[str, datetime], now: datetime) -> set[str]:
        """The drains that hold the probe at 503 at ``now`` (empty: they leave it at 200);
        ``begins`` holds every current drain of a not-started event, by key."""
        self.spent &= set(begins)
        while True:
            active = {k for k, at in begins.items() if k not in self.spent and at <= now}
            if not active:
                self.run_start = None
                return set()
            if self.run_start is None:
                self.run_start = min(begins[k] for k in active)
            end = self.run_start + self.bound
            if now < end:
                return active
            self.spent |= {k for k in active if begins[k] <= end}
            self.run_start = None

    def run_end(self) -> datetime | None:
        """When the current run reaches the bound (None: no run)."""
        return None if self.run_start is None else self.run_start + self.bound
