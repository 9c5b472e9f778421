"""history: every event's timeline on the history subscription, and its HTTP endpoints.

Registered by function_app.py when ``HistorySubscriptionName`` is set (always in Azure: the
Bicep sets it). The endpoints take a function key (``?code=`` or ``x-functions-key``): a
calendar client can subscribe only to a URL, so the key goes in the URL.
"""

from __future__ import annotations

from datetime import timedelta

import azure.functions as func

from functions.history import endpoints
from functions.shared import composition
from functions.shared.triggers import note, service_bus_function
from functions.shared.verified import VerifiedMessage

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@service_bus_function(bp, "history", "%HistorySubscriptionName%")
def history(verified: VerifiedMessage) -> None:
    """Only verified messages reach the history, each in the entry of its verified scope: an
    invented event never shows in the timeline or the calendar (a refused one is logged as a
    security event by the trigger layer), and no scope writes into another's. A storage fault
    is retried within the history's window, then raised: Service Bus redelivers."""
    deps = composition.dependencies()
    recorded = deps.history.record(verified, deps.clock())
    note(
        entries=recorded.entries,
        summaryWritten=int(recorded.written),
        purged=recorded.purged,
        replayed=recorded.replayed,
    )


def _response(answer: endpoints.Answer) -> func.HttpResponse:
    return func.HttpResponse(
        answer.body,
        status_code=answer.status,
        mimetype=answer.mimetype,
        charset="utf-8",
        headers=answer.headers,
    )


@bp.function_name("events")
@bp.route(route="events", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def events(req: func.HttpRequest) -> func.HttpResponse:
    deps = composition.dependencies()
    return _response(endpoints.list_events(deps.history, dict(req.params)))


@bp.function_name("event_timeline")
@bp.route(route="events/{eventId}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def event_timeline(req: func.HttpRequest) -> func.HttpResponse:
    deps = composition.dependencies()
    return _response(endpoints.event_timeline(deps.history, req.route_params.get("eventId", "")))


@bp.function_name("calendar")
@bp.route(route="calendar.ics", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
def calendar(req: func.HttpRequest) -> func.HttpResponse:
    deps = composition.dependencies()
    window = timedelta(days=deps.settings.calendar_window_days)
    return _response(endpoints.calendar_feed(deps.history, deps.clock(), window))
