"""What the demo shows of the history (issue 26): each event in the calendar feed before it
starts, and its timeline once it ended, read from the Function App's own endpoints.

:class:`CalendarWatch` polls ``GET /api/calendar.ics`` on the functions host while an event is
Scheduled on the topic and puts each new revision of its VEVENT on the timeline (the first, and
one per Updated: its SEQUENCE). :func:`verdict` fails the demo when an event first seen
Scheduled never showed in the feed before it started (or was cancelled), or when the history
does not know how it ended. One allowance: an event that started within :data:`GRACE` seconds
of being scheduled (the agentless demo acknowledges at once, and every workflow reads the topic
side by side) must show in the feed before it ends instead. :func:`story` prints each event's
timeline from ``GET /api/events/{eventId}``. The local functions host checks no function key
(Core Tools does not either); in Azure both take ``?code=``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.error import URLError
from urllib.request import urlopen

ENDS = ("Completed", "Cancelled")
GRACE = 2.0  # seconds: Scheduled to Started faster than the history can be asked


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urlopen(url, timeout=5) as response:  # noqa: S310 - the loopback host
            return int(response.status), response.read()
    except URLError as exc:
        status = getattr(exc, "code", 0)
        return (status if isinstance(status, int) else 0), b""
    except OSError:
        return 0, b""


def vevents(text: str) -> dict[str, dict[str, str]]:
    """The feed's VEVENTs by UID, their properties unfolded (name -> value, parameters cut)."""
    unfolded = text.replace("\r\n ", "").replace("\r\n\t", "")
    found: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in unfolded.split("\r\n"):
        if line == "BEGIN:VEVENT":
            current = {}
        elif line == "END:VEVENT" and current is not None:
            found[current.get("UID", "")] = current
            current = None
        elif current is not None and ":" in line:
            name, _, value = line.partition(":")
            current[name.split(";", 1)[0]] = value
    return found


def warm_up(host_url: str) -> None:
    """Ask the feed once before any event: the app's first call to the table (a token, a TLS
    session) is then not paid by the first event."""
    _get(f"{host_url}/api/calendar.ics")


def _when(stamp: str) -> str:
    return f"{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}Z" if len(stamp) >= 15 else stamp


@dataclass
class CalendarWatch:
    """``host_url``'s feed, read while events wait to start; what it saw, and when."""

    host_url: str
    topic_seen: list[dict[str, Any]]
    add: Callable[[str, str], None]  # (source, text) onto the timeline
    stop: threading.Event
    first_seen: dict[str, float] = field(default_factory=dict)  # event key -> wall time
    revisions: dict[str, str] = field(default_factory=dict)  # event key -> last SEQUENCE
    failures: int = 0

    def _waiting(self) -> list[str]:
        """Events Scheduled on the topic that have not ended yet (and not been shown while
        they waited to start)."""
        states: dict[str, set[str]] = {}
        for seen in list(self.topic_seen):
            states.setdefault(seen["event"].key, set()).add(seen["transition"])
        return [
            key
            for key, transitions in states.items()
            if "Scheduled" in transitions
            and not transitions & set(ENDS)
            and not ("Started" in transitions and key in self.first_seen)
        ]

    def run(self) -> None:
        while not self.stop.wait(0.1):
            waiting = self._waiting()
            if not waiting:
                continue
            status, body = _get(f"{self.host_url}/api/calendar.ics")
            if status != 200:
                self.failures += 1
                continue
            entries = vevents(body.decode("utf-8", "replace"))
            now = time.time()
            for key in waiting:
                for uid, event in entries.items():
                    # <key>.<scope digest>-<appearance>@sebridge: each scope's own entry
                    mine = uid.startswith((f"{key}.", f"{key}-"))
                    if not mine or event.get("STATUS") == "CANCELLED":
                        continue
                    sequence = event.get("SEQUENCE", "")
                    if self.revisions.get(key) == sequence:
                        continue
                    self.revisions[key] = sequence
                    self.first_seen.setdefault(key, now)
                    summary = event.get("SUMMARY", "").replace("\\,", ",")
                    self.add(
                        "ics",
                        f"VEVENT    {summary} ({key[:8]}): {_when(event.get('DTSTART', ''))} "
                        f"to {_when(event.get('DTEND', ''))}, SEQUENCE {sequence}",
                    )


def _first(topic_seen: list[dict[str, Any]], key: str, *transitions: str) -> float | None:
    times = [
        s["at"]
        for s in list(topic_seen)
        if s["event"].key == key and s["transition"] in transitions and s.get("at") is not None
    ]
    return min(times) if times else None


def timeline_of(host_url: str, key: str) -> dict[str, Any] | None:
    status, body = _get(f"{host_url}/api/events/{key}")
    if status != 200:
        return None
    try:
        document: dict[str, Any] = json.loads(body)
    except ValueError:
        return None
    return document


def scopes_of(document: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each scope's part of ``GET /api/events/{eventId}`` (an event seen by several
    placements is several entries)."""
    scopes = (document or {}).get("scopes")
    return [s for s in scopes if isinstance(s, dict)] if isinstance(scopes, list) else []


def _cancelled_before_start(watch: CalendarWatch, key: str) -> bool:
    """The event was cancelled without starting and the feed now lists it as cancelled."""
    transitions = {s["transition"] for s in list(watch.topic_seen) if s["event"].key == key}
    if "Cancelled" not in transitions or "Started" in transitions:
        return False
    status, body = _get(f"{watch.host_url}/api/calendar.ics")
    if status != 200:
        return False
    entries = vevents(body.decode("utf-8", "replace"))
    return any(
        uid.startswith((f"{key}.", f"{key}-")) and event.get("STATUS") == "CANCELLED"
        for uid, event in entries.items()
    )


def verdict(watch: CalendarWatch, expected: dict[str, Any]) -> list[str]:
    """What the history failed to show: the feed before the start, the end in the timeline."""
    missing: list[str] = []
    for key in expected:
        opened = _first(watch.topic_seen, key, "Scheduled")
        started = _first(watch.topic_seen, key, "Started", *ENDS)
        if opened is not None and (opened <= (started or float("inf"))):
            shown = watch.first_seen.get(key)
            by = started
            if started is not None and started - opened < GRACE:
                by = _first(watch.topic_seen, key, *ENDS)
            if shown is None and _cancelled_before_start(watch, key):
                # Cancelled before the feed was read again (a busy machine): the feed must
                # then say so, STATUS:CANCELLED, as a subscribed calendar would learn it.
                pass
            elif shown is None or (by is not None and shown > by):
                missing.append(f"the calendar feed did not show event {key[:8]} before it started")
        ended = {s["transition"] for s in watch.topic_seen if s["event"].key == key} & set(ENDS)
        if ended:
            document = timeline_of(watch.host_url, key)
            states = {scope["event"].get("state") for scope in scopes_of(document)}
            if not states & ended:
                missing.append(f"the history of event {key[:8]} does not show it {ended.pop()}")
    return missing


NO_PAUSE = 0.5  # seconds: below this the forwarder saw its polls on schedule


def measured_words(impact: dict[str, Any]) -> str:
    """What the forwarder measured, said as it is: the demo's VM is a process on a laptop, so a
    simulated Freeze or Reboot only changes the document, and the honest reading is "no pause
    seen" (never a made-up figure)."""
    measured = impact.get("measuredSeconds")
    if not isinstance(measured, int | float):
        return "not measured"
    method = impact.get("method") or "unknown method"
    if measured < NO_PAUSE:
        return f"{measured} s ({method}: no pause or gap seen from inside the VM)"
    return f"{measured} s ({method})"


def story(host_url: str, keys: list[str]) -> list[str]:
    """Each event's timeline as the history endpoint tells it, one line per entry."""
    lines: list[str] = []
    for key in keys:
        document = timeline_of(host_url, key)
        scopes = scopes_of(document)
        if not scopes:
            lines.append(f"  history of {key[:8]}: not found")
            continue
        for scope in scopes:
            event = scope["event"]
            impact = event.get("impact", {})
            announced = impact.get("announcedSeconds")
            said = f"{announced} s" if announced is not None else "no duration"
            lines.append(
                f"  history of {event.get('eventType')} {key[:8]} ({event.get('state')}): "
                f"announced {said}, measured {measured_words(impact)}"
            )
            for row in scope.get("timeline", []):
                details = row.get("details") or {}
                extra = ""
                if row["name"] == "Approved":
                    extra = f" by {details.get('requestedBy')}"
                elif row["name"] == "Held":
                    healthy, minimum = details.get("healthy"), details.get("minimum")
                    extra = f" (pool at {healthy} of minimum {minimum})"
                elif row["name"] == "Completed" and details.get("impact"):
                    extra = f", measured {measured_words(details['impact'])}"
                lines.append(f"    {row['at']}  {row['name']:<9} {row['source']}{extra}")
    return lines
