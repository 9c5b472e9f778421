"""The IMDS scheduled-events document, parsed into plain values (no I/O).

What real IMDS sends (see DESIGN.md): ``{"DocumentIncarnation": int, "Events": [...]}`` where
each event has EventId, EventType, ResourceType, Resources, EventStatus, NotBefore and the
optional Description, EventSource and DurationInSeconds. NotBefore is RFC 1123 in real
documents, ISO 8601 in Microsoft's mock server and ``""`` once Started.

A document is parsed strictly about what keys events (one we cannot key by EventId is rejected
whole, so that a garbled body never looks like "every event vanished") and leniently about every
other field, so that one event's odd value never blinds the forwarder to the others: the raw
value is always kept verbatim, and the parsed one is what can be read from it. An unparseable or
out-of-range NotBefore or DurationInSeconds parses to ``None`` (always); in a document (and the
forwarder's state, which keeps what documents held) an EventType or EventStatus that is not a
string reads as ``""`` (such an event is not Started), Resources that are not a list as ``()``,
and entries of the list that are not strings are skipped. A single event read on its own
(a message's data, an Event Grid notification) is strict about those three by default.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

STARTED = "Started"


class InvalidDocument(ValueError):
    """The body is not a scheduled-events document we can diff safely."""


MAX_TIME_TEXT = 64  # longer than any real spelling of a date


def parse_not_before(value: object) -> datetime | None:
    """RFC 1123 (real IMDS) or ISO 8601 (mock server) to an aware UTC datetime; "" -> None.

    Anything else, including a time that cannot be expressed in UTC (year 9999 with a negative
    offset), is None: the caller keeps the verbatim value, and one event's odd field never
    fails the document it is in.
    """
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TIME_TEXT:
        return None
    text = value.strip()
    parsed: datetime | None
    try:
        parsed = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        parsed = None
    if parsed is None:
        try:
            parsed = datetime.fromisoformat(text)
        except (ValueError, OverflowError):
            return None
    if parsed.tzinfo is None:  # IMDS times are UTC even when the zone is left out
        parsed = parsed.replace(tzinfo=UTC)
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        return None


def isoformat_utc(moment: datetime) -> str:
    """``2026-11-22T01:20:40Z`` (seconds precision unless the value has microseconds)."""
    text = moment.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


def _text(value: object) -> str:
    """A string field's value, stripped; ``""`` for anything that is not a string."""
    return value.strip() if isinstance(value, str) else ""


def _parse_duration(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


@dataclass(frozen=True)
class ScheduledEvent:
    """One entry of ``Events``. ``raw`` keeps the fields exactly as IMDS sent them."""

    event_id: str
    event_type: str
    status: str
    resource_type: str = "VirtualMachine"
    resources: tuple[str, ...] = ()
    not_before: datetime | None = None
    description: str | None = None
    event_source: str | None = None
    duration_in_seconds: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key(self) -> str:
        """EventId is a GUID: the same event in upper and lower case is one event."""
        return self.event_id.strip().lower()

    @property
    def is_started(self) -> bool:
        return self.status.strip().lower() == STARTED.lower()

    @classmethod
    def from_imds(cls, obj: object, *, strict: bool = True) -> ScheduledEvent:
        """One event. :class:`InvalidDocument` when it has no usable EventId, and when
        ``strict``, also when EventType or EventStatus is not a non-empty string or Resources
        is not a list of strings (a document's events are read with ``strict=False``)."""
        if not isinstance(obj, Mapping):
            raise InvalidDocument(f"an event is not a JSON object: {type(obj).__name__}")
        event_id = obj.get("EventId")
        if not isinstance(event_id, str) or not event_id.strip():
            raise InvalidDocument("an event has no EventId string")
        resources = obj.get("Resources", [])
        if strict:
            for name in ("EventStatus", "EventType"):
                value = obj.get(name)
                if not isinstance(value, str) or not value.strip():
                    raise InvalidDocument(f"event {event_id} has no {name} string")
            if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
                raise InvalidDocument(
                    f"event {event_id} has Resources that are not a list of strings"
                )
        resource_type = obj.get("ResourceType")
        description = obj.get("Description")
        source = obj.get("EventSource")
        return cls(
            event_id=event_id.strip(),
            event_type=_text(obj.get("EventType")),
            status=_text(obj.get("EventStatus")),
            resource_type=resource_type if isinstance(resource_type, str) else "VirtualMachine",
            resources=(
                tuple(r for r in resources if isinstance(r, str))
                if isinstance(resources, list)
                else ()
            ),
            not_before=parse_not_before(obj.get("NotBefore")),
            description=description if isinstance(description, str) else None,
            event_source=source if isinstance(source, str) else None,
            duration_in_seconds=_parse_duration(obj.get("DurationInSeconds")),
            # PascalCase keys are IMDS's own; camelCase ones are the contract's additions.
            raw={k: v for k, v in obj.items() if isinstance(k, str) and k[:1].isupper()},
        )

    def to_imds(self) -> dict[str, Any]:
        """The event as IMDS sent it (round-trips through durable state)."""
        return dict(self.raw)


@dataclass(frozen=True)
class Document:
    incarnation: int
    events: tuple[ScheduledEvent, ...]

    @classmethod
    def from_imds(cls, obj: object) -> Document:
        if not isinstance(obj, Mapping):
            raise InvalidDocument(f"the document is not a JSON object: {type(obj).__name__}")
        incarnation = obj.get("DocumentIncarnation")
        if isinstance(incarnation, bool) or not isinstance(incarnation, int):
            raise InvalidDocument("DocumentIncarnation is missing or not an integer")
        events = obj.get("Events")
        if not isinstance(events, list):
            raise InvalidDocument("Events is missing or not a list")
        parsed: list[ScheduledEvent] = []
        seen: set[str] = set()
        for item in events:
            event = ScheduledEvent.from_imds(item, strict=False)
            if event.key in seen:  # one EventId twice (e.g. in two cases): the first one wins
                continue
            seen.add(event.key)
            parsed.append(event)
        return cls(incarnation=incarnation, events=tuple(parsed))
