"""Weekly maintenance windows in an IANA time zone (pure: zoneinfo only).

An approval rule may name windows (``"windows": ["Sun 02:00-05:00 Europe/Berlin"]``): the gate
approves an event early only inside one of them, and lb-pools drains it the lead before the
window opens, so a week's notice becomes maintenance at the operator's chosen time. Outside
every window (none opens before NotBefore) the event waits for its NotBefore.

A window is a weekday, a local start and end time and a zone. An end at or before the start
runs across midnight into the next day (``Sat 23:00-02:00``); ``24:00`` ends at midnight.
Local times are wall-clock times of that day in that zone, so a window follows daylight
saving: ``Sun 02:00-05:00 Europe/Berlin`` is 01:00-04:00 UTC in winter, 00:00-03:00 in
summer. Where a local time does not exist (the hour skipped when clocks go forward) it means
the first valid instant after it (the moment of the change); where it exists twice (the hour
repeated when clocks go back), its first occurrence. A window that ends up empty that week
(it lies wholly in a skipped hour) is no window that week.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

DAY_NAMES = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_SPEC = re.compile(
    r"^\s*(?P<day>[A-Za-z]{3,9})\s+(?P<start>\d{1,2}:\d{2})\s*-\s*(?P<end>\d{1,2}:\d{2})"
    r"\s+(?P<zone>[A-Za-z0-9_+\-/]{1,64})\s*$"
)
MAX_WINDOWS = 50


class WindowError(ValueError):
    """A window that cannot be read; the message says which and why."""


@dataclass(frozen=True)
class Opening:
    """One occurrence of a window: [start, end) in UTC."""

    start: datetime
    end: datetime

    def contains(self, at: datetime) -> bool:
        return self.start <= at < self.end


@dataclass(frozen=True)
class Window:
    weekday: int  # Monday 0
    start: time
    end: time  # time(0) with ``end_midnight``: 24:00
    end_midnight: bool
    zone: tzinfo
    text: str

    @property
    def overnight(self) -> bool:
        return self.end_midnight or self.end <= self.start

    def opening_on(self, day: date) -> Opening | None:
        """The window that opens on local ``day`` (a date of its weekday), or None if empty."""
        start = to_utc(datetime.combine(day, self.start), self.zone)
        end_day = day + timedelta(days=1) if self.overnight else day
        end = to_utc(datetime.combine(end_day, self.end), self.zone)
        return Opening(start, end) if end > start else None

    def openings_around(self, at: datetime) -> list[Opening]:
        """The openings whose local day is from a week before ``at`` to two weeks after it."""
        local = at.astimezone(self.zone).date()
        out: list[Opening] = []
        for offset in range(-8, 16):
            day = local + timedelta(days=offset)
            if day.weekday() != self.weekday:
                continue
            opening = self.opening_on(day)
            if opening is not None:
                out.append(opening)
        return out


def to_utc(local: datetime, zone: tzinfo) -> datetime:
    """A wall-clock time in ``zone`` as a UTC instant: its first occurrence when it is repeated,
    the first valid instant after it (the change) when it is skipped."""
    naive = local.replace(tzinfo=None)
    first = naive.replace(tzinfo=zone, fold=0).astimezone(UTC)
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return first
    # Skipped: fold=1 reads it with the offset after the change, fold=0 with the one before;
    # the change lies between the two instants. Find it to the second.
    low = naive.replace(tzinfo=zone, fold=1).astimezone(UTC)
    high = first
    if low > high:
        low, high = high, low
    before = low.astimezone(zone).utcoffset()
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == before:
            low = middle
        else:
            high = middle
    return high.replace(microsecond=0) if high.microsecond else high


def _clock(text: str, where: str, *, end: bool) -> tuple[time, bool]:
    hours, _, minutes = text.partition(":")
    h, m = int(hours), int(minutes)
    if end and (h, m) == (24, 0):
        return time(0), True
    if not (0 <= h <= 23 and 0 <= m <= 59):
        raise WindowError(f"{where}: {text!r} is not a time of day (00:00 to 23:59)")
    return time(h, m), False


def parse_window(text: object, where: str = "window") -> Window:
    """``"Sun 02:00-05:00 Europe/Berlin"``; :class:`WindowError` naming ``where``."""
    if not isinstance(text, str):
        raise WindowError(f"{where}: expected a string like 'Sun 02:00-05:00 Europe/Berlin'")
    match = _SPEC.match(text)
    if match is None:
        raise WindowError(
            f"{where}: {text[:80]!r} is not 'DAY HH:MM-HH:MM ZONE' "
            "(e.g. 'Sun 02:00-05:00 Europe/Berlin')"
        )
    day = match["day"].lower()
    weekday = next((i for i, name in enumerate(DAY_NAMES) if day in (name, name[:3])), None)
    if weekday is None:
        raise WindowError(f"{where}: {match['day']!r} is not a day of the week (Mon..Sun)")
    start, _ = _clock(match["start"], where, end=False)
    end, midnight = _clock(match["end"], where, end=True)
    if not midnight and end == start:
        raise WindowError(f"{where}: the window starts and ends at {match['start']}")
    try:
        zone = ZoneInfo(match["zone"])
    except (ZoneInfoNotFoundError, ValueError):
        raise WindowError(
            f"{where}: {match['zone']!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)"
        ) from None
    return Window(weekday, start, end, midnight, zone, text.strip())


def parse_windows(value: object, where: str = "windows") -> tuple[Window, ...]:
    """A non-empty list of window strings."""
    if not isinstance(value, list) or not value:
        raise WindowError(f"{where}: expected a non-empty list of windows")
    if len(value) > MAX_WINDOWS:
        raise WindowError(f"{where}: more than {MAX_WINDOWS} windows")
    return tuple(parse_window(v, f"{where}[{i}]") for i, v in enumerate(value))


def current_or_next(windows: Iterable[Window], at: datetime) -> Opening | None:
    """The opening that contains ``at``, else the next to open after it (None: no window)."""
    best: Opening | None = None
    for window in windows:
        for opening in window.openings_around(at):
            if opening.end <= at:
                continue
            if best is None or (opening.start, opening.end) < (best.start, best.end):
                best = opening
    return best


def before(windows: Iterable[Window], at: datetime, not_before: datetime | None) -> Opening | None:
    """The opening an event is approved in, decided at ``at`` (the deciding app's clock, never
    the message's time): the one that contains ``at`` or the next to open, if it opens before
    ``not_before`` (None: no bound). None: the event waits for its NotBefore. lb-pools drains
    for this opening and the gate decides in it: both ask this, so they agree."""
    opening = current_or_next(windows, at)
    if opening is None or (not_before is not None and opening.start >= not_before):
        return None
    return opening


def inside(windows: Sequence[Window], at: datetime) -> bool:
    opening = current_or_next(windows, at)
    return opening is not None and opening.contains(at)
