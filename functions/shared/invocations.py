"""One structured log line per invocation, so one event can be followed through every workflow
in Application Insights (docs/monitoring.md, "Telemetry").

Every Service Bus trigger, and the Event Grid trigger of agentless ingestion, is decorated with
:func:`log_invocation`; :func:`decode` (in
``triggers.py``) tells the current invocation what it decoded, and a workflow may add an outcome
of its own with :func:`note`. When the trigger returns or raises, one line is logged on the
logger ``sebridge.functions.invocation``::

    sebridge.invocation {"deliveryCount":1,"durationMs":12.5,"eventId":"8b95...","function":
    "teams","messageId":"8b95...:Scheduled:1","outcome":"ok","traceId":"21c4...",
    "transition":"Scheduled",...}

The text after the prefix is JSON, so a KQL query can ``parse_json`` it whatever carries the log
to Application Insights (the Functions host keeps only the message text; with OpenTelemetry the
same fields also arrive as customDimensions, passed as ``extra``). The line never carries a
message body, a URL or an exception's text: only ids, names, counts and the exception's class.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import azure.functions as func

from sebridge.contract import tracecontext
from sebridge.contract.events import TransitionMessage

INVOCATION_PREFIX = "sebridge.invocation "
LOGGER_NAME = "sebridge.functions.invocation"
MAX_TEXT = 128  # ids are at most 128 characters in the contract; anything longer is cut

# What a decorated trigger ended with; a workflow may name a finer outcome with note().
# REFUSED: the message failed the seal or the scope check (functions.shared.verified).
OK, DROPPED, ERROR, REFUSED = "ok", "dropped", "error", "refused"

log = logging.getLogger(LOGGER_NAME)

Trigger = Callable[..., None]  # one argument: a ServiceBusMessage, or an Event Grid event
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


@dataclass
class _Invocation:
    function: str
    message_id: str | None
    delivery_count: int | None
    started: float
    message: TransitionMessage | None = None
    dropped: bool = False
    outcome: str | None = None
    details: dict[str, str | int] = field(default_factory=dict)


_current: ContextVar[_Invocation | None] = ContextVar("sebridge_invocation", default=None)


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "\u2026"


def remember(message: TransitionMessage | None) -> None:
    """Called by ``decode``: the message the current invocation works on (None: dropped)."""
    record = _current.get()
    if record is not None:
        record.message = message
        record.dropped = message is None


def note(outcome: str | None = None, /, **details: str | int) -> None:
    """A workflow's own outcome (``skipped``, ``rejected``...) and counts for the line."""
    clash = _RESERVED.intersection(details) | {"function", "outcome"}.intersection(details)
    if clash:
        raise ValueError(f"invocation details may not be named {sorted(clash)}")
    record = _current.get()
    if record is None:
        return
    if outcome:
        record.outcome = outcome
    record.details.update(details)


def invocation_fields(
    record: _Invocation, *, error: str | None, duration_seconds: float
) -> dict[str, str | int | float | None]:
    """The line's fields (pure): what the invocation was about and how it ended."""
    message = record.message
    event = message.event if message is not None else None
    if error is not None:
        outcome = ERROR
    elif record.dropped:
        outcome = DROPPED
    else:
        outcome = record.outcome or OK
    fields: dict[str, str | int | float | None] = {
        "function": record.function,
        "messageId": _text(record.message_id or (message.message_id if message else None)),
        "eventId": _text(event.key) if event is not None else None,
        "transition": message.transition.value if message is not None else None,
        "eventType": _text(event.event_type) if event is not None else None,
        "vmName": _text(message.observer.vm_name) if message is not None else None,
        "deliveryCount": record.delivery_count,
        "outcome": outcome,
        "durationMs": round(duration_seconds * 1000, 1),
    }
    if error is not None:
        fields["error"] = error
    for key, value in record.details.items():
        if fields.get(key) is None:  # a detail fills in what no message said (Event Grid)
            fields[key] = _text(value) if isinstance(value, str) else value
    # The event's trace (operation_Id of its spans in Application Insights): from logs to spans.
    about = event.key if event is not None else fields.get("eventId")
    fields["traceId"] = tracecontext.trace_id(about) if isinstance(about, str) and about else None
    return fields


def _emit(record: _Invocation, error: str | None, duration: float) -> None:
    try:
        fields = invocation_fields(record, error=error, duration_seconds=duration)
        line = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        level = logging.WARNING if error is not None else logging.INFO
        log.log(level, "%s%s", INVOCATION_PREFIX, line, extra=fields)
    except Exception:  # the line must never change what happens to the message
        log.exception("invocation line for %s could not be written", record.function)


def _delivery_count(message: func.ServiceBusMessage) -> int | None:
    try:
        count = message.delivery_count
    except Exception:  # noqa: BLE001 - a worker that does not set it
        return None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


def _invocation(function: str, argument: object) -> _Invocation:
    """The record of one invocation: a Service Bus message's id and delivery count, or an
    Event Grid event's id (as the ``eventGridId`` detail: it is not a message id)."""
    record = _Invocation(function, None, None, time.monotonic())
    if isinstance(argument, func.ServiceBusMessage):
        record.message_id = argument.message_id
        record.delivery_count = _delivery_count(argument)
    else:
        event_grid_id = _text(getattr(argument, "id", None))
        if event_grid_id is not None:
            record.details["eventGridId"] = event_grid_id
    return record


def log_invocation(trigger: Trigger) -> Trigger:
    """Decorate a trigger (below the binding decorators): one line per invocation.

    The function name in the line is the Python function's name, which is also the name each
    blueprint registers (``@bp.function_name``). ``functools.wraps`` keeps the signature and the
    annotations the Functions worker reads to bind the argument (``msg``, ``event``), which it
    passes by name.
    """

    @functools.wraps(trigger)
    def run(*args: Any, **kwargs: Any) -> None:
        (argument,) = (*args, *kwargs.values())
        record = _invocation(trigger.__name__, argument)
        token = _current.set(record)
        error: str | None = None
        try:
            trigger(*args, **kwargs)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            _current.reset(token)
            _emit(record, error, time.monotonic() - record.started)

    return run
