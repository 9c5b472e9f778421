"""The history's HTTP endpoints as plain functions (the blueprint only converts).

``GET /api/events`` (filters: state, vm, resourceGroup, from, to, limit), ``GET
/api/events/{eventId}`` (one event's timeline) and ``GET /api/calendar.ics`` (the feed). Each
answers a :class:`Answer`; a filter or an EventId that is not valid gets 400 before anything
reaches the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from functions.history import calendar
from functions.history.core import (
    MAX_LIMIT,
    EventQuery,
    History,
    QueryError,
    event_key,
    impact_by_type,
    parse_query,
    select,
    timeline_json,
)

JSON = "application/json"
ICALENDAR = "text/calendar"
CALENDAR_LIMIT = MAX_LIMIT
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
    events = select(history.store.summaries(query), query)
    return _json(
        200,
        {
            "events": [summary.to_json() for summary in events],
            "count": len(events),
            "limit": query.limit,
            "impactByEventType": impact_by_type(events),
        },
    )


def event_timeline(history: History, event_id: str) -> Answer:
    if not _EVENT_ID.fullmatch(event_id):
        return _json(400, {"error": "eventId is not an EventId"})
    found = history.timeline(event_key(event_id))
    if found is None:
        return _json(404, {"error": "no such event in the history"})
    summary, entries = found
    return _json(200, timeline_json(summary, entries))


def calendar_feed(history: History, now: datetime, window: timedelta) -> Answer:
    query = EventQuery(start=now - window, end=now + window, limit=CALENDAR_LIMIT)
    events = select(history.store.summaries(query), query)
    return Answer(
        200,
        calendar.feed(events, now, window),
        mimetype=ICALENDAR,
        headers={
            "Cache-Control": "no-store",
            "Content-Disposition": 'inline; filename="maintenance.ics"',
        },
    )
