"""W3C Trace Context for one scheduled event: every observer derives the same trace (pure).

One trace per event, whichever source saw it first (a forwarder, another VM's forwarder, Event
Grid) and whoever handles it later, with no coordination: the **trace id** is the first 16 bytes
of SHA-256 of the event's ``ref`` (:func:`sebridge.lifecycle.event_ref`: the lower-case EventId,
the same key message ids and session ids are built on), so an operator can compute it from an
EventId alone::

    printf %s 8b95c271-2b77-4243-ad1a-585faa9cd908 | sha256sum | cut -c1-32

The ref, not the EventId plus a scope: IMDS and Event Grid name one event by the same EventId but
describe its scope differently (the observing VM; the VM, scale set or availability set), and a
trace must not split where the two sources disagree. An event that vanishes and comes back keeps
its trace (its messages say which appearance they belong to).

A message's **span id** is the first 8 bytes of SHA-256 of its ``message_id``: a replay of a
message carries the same parent. The forwarder exports no spans (it stays small, with no
OpenTelemetry on the VM), so that span is a name for the message's sending; the workflows'
spans are its children.

The carrier is the message's application properties: ``traceparent`` (W3C Trace Context level 1,
``00-<trace id>-<span id>-01``) and ``Diagnostic-Id`` (the same value: the property the Azure SDK
and the Functions host read for Service Bus). Both are optional in contract v1.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sebridge.lifecycle import event_ref

TRACEPARENT = "traceparent"
DIAGNOSTIC_ID = "Diagnostic-Id"
VERSION = "00"
SAMPLED = "01"

_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
# Level 1: version, trace id, parent id, flags; lower-case hex. A later version may append
# fields after a dash (parsed as version 00, as the specification asks).
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


@dataclass(frozen=True)
class TraceContext:
    trace_id: str  # 32 lower-case hex digits, not all zero
    span_id: str  # 16 lower-case hex digits, not all zero
    flags: str = SAMPLED

    @property
    def traceparent(self) -> str:
        return f"{VERSION}-{self.trace_id}-{self.span_id}-{self.flags}"

    def properties(self) -> dict[str, str]:
        """The application properties that carry it."""
        return {TRACEPARENT: self.traceparent, DIAGNOSTIC_ID: self.traceparent}


def _digest(text: str, hex_digits: int, zero: str) -> str:
    value = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:hex_digits]
    return value if value != zero else zero[:-1] + "1"  # all zeros is invalid (2^-64 odds)


def trace_id(event_id: str) -> str:
    """The trace id of every span and message about ``event_id`` (any case or spelling that
    :func:`~sebridge.lifecycle.event_ref` folds together)."""
    return _digest(event_ref(event_id), 32, _ZERO_TRACE)


def span_id(message_id: str) -> str:
    """The span id that stands for sending ``message_id``."""
    return _digest(message_id, 16, _ZERO_SPAN)


def for_message(event_id: str, message_id: str) -> TraceContext:
    """The context a message about ``event_id`` carries when its sender has no span of its own."""
    return TraceContext(trace_id(event_id), span_id(message_id))


def parse(value: object) -> TraceContext | None:
    """A ``traceparent`` value, or None when it is not one (never raises).

    Accepts what OpenTelemetry's ``TraceContextTextMapPropagator`` accepts (a test holds the two
    together), and bytes (an AMQP property may arrive as binary); refuses version ``ff``,
    all-zero ids, upper-case hex, a version-00 header with anything after the flags, and (stricter
    than the propagator) a line break or more than 512 characters.
    """
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or len(value) > 512:
        return None
    match = _TRACEPARENT.fullmatch(value.strip(" \t"))  # optional whitespace, as in HTTP
    if match is None:
        return None
    version, trace, span, flags, rest = match.groups()
    if version == "ff" or (version == VERSION and rest) or trace == _ZERO_TRACE:
        return None
    if span == _ZERO_SPAN:
        return None
    return TraceContext(trace, span, flags)


def from_properties(properties: Mapping[Any, Any] | None) -> TraceContext | None:
    """The context carried by a message's application properties (``traceparent``, else
    ``Diagnostic-Id``), whether their keys arrive as text or as bytes; None without one."""
    if not properties:
        return None
    for name in (TRACEPARENT, DIAGNOSTIC_ID):
        for key in (name, name.encode("ascii")):
            found = parse(properties.get(key))
            if found is not None:
                return found
    return None


def log_fields(context: TraceContext | None) -> dict[str, str]:
    """``extra`` for a log line about a traced message: ``trace_id`` and ``span_id`` (the field
    names of OpenTelemetry's log records), nothing without a context."""
    if context is None:
        return {}
    return {"trace_id": context.trace_id, "span_id": context.span_id}
