"""The history's HTTP endpoints as plain functions (the blueprint only converts).

``GET /api/events`` (filters: state, vm, resourceGroup, from, to, limit; the latest first,
from the store's time index, the limit shared out among the scopes: core.fair_share),
``GET /api/events/{eventId}`` (the event as each scope that saw it tells it) and
``GET /api/calendar.ics`` (the feed: the events nearest to now, the upcoming ones first).
Each answers a :class:`Answer`; a filter or an EventId that is not valid gets 400 before
anything reaches the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from functions.history import calendar
from functions.history.core import (
    MAX_LIMIT,
    MAX_SCAN,
    EventQuery,
    History,
    QueryError,
    clamp_time,
    event_key,
    fair_share,
    impact_by_type,
    parse_query,
    select,
    shifted,
    timeline_json,
)

JSON = "application/json"
ICALENDAR = "text/calendar"
CALENDAR_LIMIT = MAX_LIMIT  # events (each with its appearances in the window) per feed
_EVENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    mimetype: str = JSON
    headers: dict[str, str] = field(default_factory=dict)


def _json(status: int, document: Mapping[str, Any]) -> Answer:
    return Answer(
        status,
        json.dumps(document, separators=(",", ":"), sort_keys=True),
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )


def list_events(history: History, params: Mapping[str, str]) -> Answer:
    try:
        query = parse_query(params)
    except QueryError as exc:
        return _json(400, {"error": str(exc)})
    scan = replace(query, limit=MAX_SCAN)
    listing = history.store.latest(scan)
    events = fair_share(select(listing.summaries, scan), query.limit)
    return _json(
        200,
        {
            "events": [summary.to_json() for summary in events],
            "count": len(events),
            "limit": query.limit,
            "complete": listing.complete,
            "impactByEventType": impact_by_type(events),
        },
    )


def event_timeline(history: History, event_id: str) -> Answer:
    if not _EVENT_ID.fullmatch(event_id):
        return _json(400, {"error": "eventId is not an EventId"})
    found = history.timeline(event_key(event_id))
    if not found:
        return _json(404, {"error": "no such event in the history"})
    return _json(
        200,
        {
            "eventId": found[0].summary.event_id,
            "scopes": [timeline_json(timeline) for timeline in found],
        },
    )


def calendar_feed(history: History, now: datetime, window: timedelta) -> Answer:
    """The events whose time is nearest to now within the window: the upcoming ones first
    (the earliest first), then the past ones (the latest first), :data:`CALENDAR_LIMIT` in
    all, each shared out equally among the scopes (:func:`fair_share`), so every scope's next
    maintenance is in, however many events another scope reports."""
    now = clamp_time(now)
    start, end = shifted(now, -window), shifted(now, window)
    events = fair_share(history.store.upcoming(now, end, MAX_SCAN), CALENDAR_LIMIT)
    room = CALENDAR_LIMIT - len(events)
    if room > 0 and start < now:
        past = EventQuery(start=start, end=now - timedelta(microseconds=1), limit=MAX_SCAN)
        events += fair_share(select(history.store.latest(past).summaries, past), room)
    return Answer(
        200,
        calendar.feed(events, now, window),
        mimetype=ICALENDAR,
        headers={
            "Cache-Control": "no-store",
            "Content-Disposition": 'inline; filename="maintenance.ics"',
        },
    )
