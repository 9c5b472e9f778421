"""The maintenance calendar: event summaries as an iCalendar feed (RFC 5545), pure.

One VEVENT per appearance of an event (an event that ends and comes back is a new entry), for
the VMs it names:

- ``UID`` ``<eventId>.<scope>-<appearance>@sebridge`` (the scope: a digest of the verified
  placement that saw it): stable, so a calendar client that subscribed updates the entry
  rather than adding another;
- ``DTSTART`` NotBefore (else when it started, else when it was first seen), or when it
  started if that was earlier (approved early; a NotBefore a VM invented):
  :attr:`~functions.history.core.Appearance.when`; ``DTEND`` DTSTART + DurationInSeconds, or
  :data:`DEFAULT_DURATION` when the duration is unknown or -1;
- ``SEQUENCE`` the number of Updated transitions, plus one once Cancelled, plus one once it
  started before its NotBefore, so every change is a new revision; ``STATUS`` ``CANCELLED``
  for a cancelled event, else ``CONFIRMED``;
- ``DTSTAMP`` the feed's time, ``CREATED``/``LAST-MODIFIED`` the first and last entry; every
  DATE-TIME has a four-digit year (the times are held to 1601..9999, Azure Table's range);
- text escaped (``\\``, ``;``, ``,``, newlines; control characters dropped), lines folded at 75
  octets (never inside a UTF-8 sequence), every line ended by CRLF.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from functions.history.core import LATEST, Appearance, EventSummary, clamp_time, shifted

DEFAULT_DURATION = timedelta(minutes=15)
PRODID = "-//Scheduled Events Bridge//sebridge history//EN"
CALENDAR_NAME = "Azure VM maintenance"
MAX_LINE_OCTETS = 75
MAX_SUMMARY_VMS = 5


def escape(text: str) -> str:
    """TEXT value escaping (RFC 5545 3.3.11); control characters other than newline dropped."""
    clean = "".join(ch for ch in text if ch == "\n" or (ch >= " " and ch != "\x7f"))
    return (
        clean.replace("\\", "\\\\")
        .replace(";", "\\;")
        .replace(",", "\\,")
        .replace("\r\n", "\n")
        .replace("\n", "\\n")
    )


def fold(line: str) -> str:
    """Fold a content line at 75 octets (RFC 5545 3.1), between UTF-8 characters."""
    out: list[str] = []
    current = ""
    size = 0
    limit = MAX_LINE_OCTETS
    for ch in line:
        width = len(ch.encode("utf-8"))
        if size + width > limit:
            out.append(current)
            current, size = " ", 1  # a continuation line starts with one space
        current += ch
        size += width
    out.append(current)
    return "\r\n".join(out)


def stamp(moment: datetime) -> str:
    """A UTC DATE-TIME (RFC 5545 3.3.5): ``YYYYMMDDTHHMMSSZ``, the year always four digits
    (strftime's ``%Y`` does not pad years before 1000)."""
    t = clamp_time(moment)
    return f"{t.year:04d}{t.month:02d}{t.day:02d}T{t.hour:02d}{t.minute:02d}{t.second:02d}Z"


def _summary_text(summary: EventSummary, appearance: Appearance) -> str:
    vms = list(appearance.resources) or list(summary.vms)
    shown = ", ".join(vms[:MAX_SUMMARY_VMS])
    if len(vms) > MAX_SUMMARY_VMS:
        shown += f" +{len(vms) - MAX_SUMMARY_VMS}"
    prefix = "Cancelled: " if appearance.state == "Cancelled" else ""
    return f"{prefix}{appearance.event_type or 'Maintenance'}: {shown or 'unknown VM'}"


def _description(summary: EventSummary, appearance: Appearance) -> str:
    announced = appearance.announced_seconds
    lines = [
        f"State: {appearance.state}",
        f"Event: {summary.event_id}",
        f"VMs: {', '.join(appearance.resources or summary.vms)}",
        f"Resource group: {summary.resource_group or '-'}",
        f"Source: {appearance.event_source or '-'}",
        f"Announced duration: {f'{announced} s' if announced is not None else 'not announced'}",
    ]
    if appearance.measured_seconds is not None:
        lines.append(
            f"Measured impact: {appearance.measured_seconds:g} s ({appearance.measure_method})"
        )
    elif appearance.state == "Completed":
        lines.append("Measured impact: not measured")
    if appearance.approved_by:
        lines.append(f"Approved by: {appearance.approved_by}")
    if appearance.held:
        lines.append(f"Held: {appearance.held_pool}")
    if appearance.description:
        lines.append(f"Description: {appearance.description}")
    return "\n".join(lines)


def vevent(summary: EventSummary, appearance: Appearance, now: datetime) -> list[str]:
    start = clamp_time(appearance.when)
    duration = appearance.announced_seconds
    length = timedelta(seconds=duration) if duration else DEFAULT_DURATION
    end = start + length if LATEST - start > length else LATEST  # never past 9999
    moved = appearance.not_before is not None and start < clamp_time(appearance.not_before)
    sequence = appearance.updates + (appearance.state == "Cancelled") + moved
    status = "CANCELLED" if appearance.state == "Cancelled" else "CONFIRMED"
    return [
        "BEGIN:VEVENT",
        f"UID:{summary.key}-{appearance.number}@sebridge",
        f"DTSTAMP:{stamp(now)}",
        f"DTSTART:{stamp(start)}",
        f"DTEND:{stamp(end)}",
        f"SEQUENCE:{sequence}",
        f"STATUS:{status}",
        f"CREATED:{stamp(appearance.first_seen)}",
        f"LAST-MODIFIED:{stamp(appearance.last_seen)}",
        f"SUMMARY:{escape(_summary_text(summary, appearance))}",
        f"DESCRIPTION:{escape(_description(summary, appearance))}",
        f"CATEGORIES:{escape(appearance.event_type or 'Maintenance')}",
        "TRANSP:OPAQUE",
        "END:VEVENT",
    ]


def in_window(appearance: Appearance, now: datetime, window: timedelta) -> bool:
    return shifted(now, -window) <= clamp_time(appearance.when) <= shifted(now, window)


def feed(summaries: Iterable[EventSummary], now: datetime, window: timedelta) -> str:
    """The VCALENDAR of every appearance whose time is within ``window`` of ``now``."""
    lines = [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        f"PRODID:{PRODID}",
        "CALSCALE:GREGORIAN",
        "METHOD:PUBLISH",
        f"X-WR-CALNAME:{escape(CALENDAR_NAME)}",
        "X-PUBLISHED-TTL:PT15M",
        "REFRESH-INTERVAL;VALUE=DURATION:PT15M",
    ]
    chosen = [
        (summary, appearance)
        for summary in summaries
        for appearance in summary.appearances
        if in_window(appearance, now, window)
    ]
    chosen.sort(key=lambda pair: (pair[1].when, pair[0].key, pair[1].number))
    for summary, appearance in chosen:
        lines.extend(vevent(summary, appearance, now))
    lines.append("END:VCALENDAR")
    return "".join(fold(line) + "\r\n" for line in lines)
