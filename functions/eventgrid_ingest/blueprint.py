"""eventgrid-ingest: scheduled events from Event Grid onto the topic (agentless mode).

The Event Grid trigger is thin: it hands the notification, in either delivery schema, to the
core. A notification that cannot be read is logged and dropped there; a storage or Service Bus
failure raises, the host answers Event Grid with a 500 and Event Grid redelivers (with backoff,
up to its retry policy), which the core makes harmless.
"""

from __future__ import annotations

from typing import Any

import azure.functions as func

from functions.eventgrid_ingest.notification import (
    InvalidNotification,
    RawNotification,
    parse_notification,
)
from functions.shared import composition, invocations, tracing

bp = func.Blueprint()  # type: ignore[no-untyped-call]


def raw_notification(event: Any) -> RawNotification:
    """An EventGridEvent (Event Grid schema) or a CloudEvent (CloudEvents schema) as the
    Python worker hands them over (azure.functions' own classes)."""
    if isinstance(event, func.CloudEvent):
        return RawNotification(
            id=event.id,
            event_type=event.type,
            time=event.time,
            topic=event.source,
            subject=event.subject,
            data=event.get_json(),
        )
    return RawNotification(
        id=event.id,
        event_type=event.event_type,
        time=event.event_time,
        topic=event.topic,
        subject=event.subject,
        data=event.get_json(),
    )


def _event_id(raw: RawNotification) -> str | None:
    """The EventId the notification is about (its trace: one per event, whichever source saw
    it), or None for one that cannot be read (the core logs why)."""
    try:
        return parse_notification(raw).event.event_id
    except InvalidNotification:
        return None


@bp.function_name("eventgrid_ingest")
@bp.event_grid_trigger(arg_name="event")
@invocations.log_invocation
def eventgrid_ingest(event: func.EventGridEvent) -> None:
    deps = composition.dependencies()
    raw = raw_notification(event)
    with tracing.invocation_span(
        "eventgrid_ingest",
        properties=None,
        event_id=_event_id(raw),
        message_id=f"eventgrid:{str(raw.id)[:256]}",
    ):
        outcome = deps.eventgrid_ingest.handle_raw(raw)
    # The invocation line: "dropped" for a notification that cannot be read (as a Service Bus
    # message that breaks the contract), else "ok"; the verdict and what was published beside.
    invocations.note(
        invocations.DROPPED if outcome.verdict == "invalid" else None,
        verdict=outcome.verdict,
        published=len(outcome.published),
        **outcome.about,
    )
