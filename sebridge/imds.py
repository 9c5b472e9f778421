"""The IMDS scheduled-events document, parsed into plain values (no I/O).

What real IMDS sends (see DESIGN.md): ``{"DocumentIncarnation": int, "Events": [...]}`` where
each event has EventId, EventType, ResourceType, Resources, EventStatus, NotBefore and the
optional Description, EventSource and DurationInSeconds. NotBefore is RFC 1123 in real
documents, ISO 8601 in Microsoft's mock server and ``""`` once Started.

The one tolerant reader of an event, for documents and for a single event read from a message
alike: strict only about what keys an event (one without a usable EventId is refused, and in a
document refuses the document whole, so that a garbled body never looks like "every event
vanished") and lenient about every other field, so that one odd value never hides an event: the
raw value is always kept verbatim, and the parsed one is what can be read from it. Every
normalisation is reported in ``warnings`` (one line per field, naming it and what was done:
``Resources[1]: 5 is not a string: dropped``), so that whoever reads it can say so once. An
EventType or EventStatus that is not a string reads as ``""`` (such an event is not Started),
Resources that are not a list as ``()``, entries of the list that are not strings are dropped,
an unparseable or out-of-range NotBefore or DurationInSeconds reads as ``None``, a
Description, EventSource or ResourceType that is not a string is dropped, and a
DocumentIncarnation that is not an integer reads as ``None``. ``strict=True`` (the default
of :meth:`ScheduledEvent.from_imds`, kept for the Event Grid ingestion) refuses an event whose
EventType, EventStatus or Resources cannot be read instead.
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sebridge.times import MAX_SPAN_SECONDS, readable

STARTED = "Started"


class InvalidDocument(ValueError):
    """The body is not a scheduled-events document we can diff safely."""


MAX_TIME_TEXT = 64  # longer than any real spelling of a date


# The year of an RFC 1123 date as written ("19 Sep 2016"): email.utils reads a year of one or two
# digits as 19xx/20xx (RFC 2822's obsolete two-digit years), so "0001" would become 2001.
_RFC1123_YEAR = re.compile(r"\b\d{1,2}\s+[A-Za-z]{3,}\s+(\d+)\b")


def parse_not_before(value: object) -> datetime | None:
    """RFC 1123 (real IMDS) or ISO 8601 (mock server) to an aware UTC datetime; "" -> None.

    Anything else is None: a time that cannot be expressed in UTC (year 9999 with a negative
    offset), one outside :data:`sebridge.times.EARLIEST` .. :data:`sebridge.times.LATEST`
    (year 1: "not a time we can act on", at first sight, never an OverflowError downstream),
    and an RFC 1123 year written with more than two digits that the parser read as another
    year ("0001" as 2001). The caller keeps the verbatim value, and one event's odd field never
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
    if parsed is not None:
        written = _RFC1123_YEAR.search(text)
        if written is not None and len(written[1]) > 2 and int(written[1]) != parsed.year:
            return None  # read as another year than the one written
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except (ValueError, OverflowError):
            return None
    return readable(parsed)  # naive: UTC (IMDS times are UTC even when the zone is left out)


def isoformat_utc(moment: datetime) -> str:
    """``2026-11-22T01:20:40Z`` (seconds precision unless the value has microseconds)."""
    text = moment.astimezone(UTC).isoformat()
    return text.replace("+00:00", "Z")


MAX_WARNINGS = 20  # per event: a list of 10,000 odd Resources is one line, not 10,000
_SHOWN = 60  # characters of an odd value quoted in a warning


def show(value: object) -> str:
    """An odd value as a warning quotes it: JSON, ASCII (control characters escaped), short."""
    try:
        text = json.dumps(value, ensure_ascii=True, sort_keys=True, default=repr)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


class _Notes:
    """The warnings of one event (or document), bounded."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[str] = []
        self.more = 0

    def add(self, name: str, problem: str) -> None:
        if len(self.lines) < MAX_WARNINGS:
            self.lines.append(f"{self.prefix}{name}: {problem}")
        else:
            self.more += 1

    def done(self) -> tuple[str, ...]:
        if self.more:
            return (*self.lines, f"{self.prefix}...: {self.more} more odd value(s)")
        return tuple(self.lines)


def _text(obj: Mapping[str, Any], name: str, notes: _Notes) -> str:
    """A required string field, stripped; ``""`` (reported) for anything that is not one."""
    value = obj.get(name)
    if isinstance(value, str):
        return value.strip()
    notes.add(
        name,
        'missing: read as ""' if value is None else f'{show(value)} is not a string: read as ""',
    )
    return ""


def _optional_text(obj: Mapping[str, Any], name: str, notes: _Notes) -> str | None:
    value = obj.get(name)
    if value is None or isinstance(value, str):
        return value
    notes.add(name, f"{show(value)} is not a string: dropped")
    return None


def _resources(obj: Mapping[str, Any], notes: _Notes) -> tuple[str, ...]:
    if "Resources" not in obj:
        return ()
    value = obj["Resources"]
    if not isinstance(value, list):
        notes.add("Resources", f"{show(value)} is not a list: read as []")
        return ()
    kept: list[str] = []
    for index, item in enumerate(value):
        if isinstance(item, str):
            kept.append(item)
        else:
            notes.add(f"Resources[{index}]", f"{show(item)} is not a string: dropped")
    return tuple(kept)


def _parse_duration(value: object) -> int | None:
    """Whole seconds (IMDS sends -1 for unknown); None for anything else, and for a span
    beyond :data:`sebridge.times.MAX_SPAN_SECONDS` either way (no real maintenance lasts a
    year, and a time plus it stays representable)."""
    number: int | None = None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and len(value) <= MAX_TIME_TEXT:
        try:
            number = int(value.strip())
        except ValueError:
            return None
    if number is None or abs(number) > MAX_SPAN_SECONDS:
        return None
    return number


def _not_before(obj: Mapping[str, Any], notes: _Notes) -> datetime | None:
    value = obj.get("NotBefore")
    parsed = parse_not_before(value)
    if parsed is None and value is not None and value != "":
        if isinstance(value, str):
            problem = "" if not value.strip() else f"{show(value)} is not a time: read as null"
        else:
            problem = f"{show(value)} is not a string: read as null"
        if problem:
            notes.add("NotBefore", problem)
    return parsed


def _duration(obj: Mapping[str, Any], notes: _Notes) -> int | None:
    value = obj.get("DurationInSeconds")
    parsed = _parse_duration(value)
    if parsed is None and value is not None:
        notes.add("DurationInSeconds", f"{show(value)} is not a whole number: read as null")
    return parsed


@dataclass(frozen=True)
class ScheduledEvent:
    """One entry of ``Events``. ``raw`` keeps the fields exactly as IMDS sent them; ``warnings``
    says what reading them normalised (empty for a well-formed event)."""

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
    warnings: tuple[str, ...] = field(default=(), compare=False, hash=False, repr=False)

    @property
    def key(self) -> str:
        """EventId is a GUID: the same event in upper and lower case is one event."""
        return self.event_id.strip().lower()

    @property
    def is_started(self) -> bool:
        return self.status.strip().lower() == STARTED.lower()

    @classmethod
    def from_imds(cls, obj: object, *, strict: bool = True, prefix: str = "") -> ScheduledEvent:
        """One event. :class:`InvalidDocument` when it has no usable EventId, and when
        ``strict``, also when EventType or EventStatus is not a non-empty string or Resources
        is not a list of strings. Otherwise every other field is read as well as it can be and
        each normalisation is reported in ``warnings``, each line starting with ``prefix``
        (``data.`` for a message's data)."""
        if not isinstance(obj, Mapping):
            raise InvalidDocument(f"an event is not a JSON object: {type(obj).__name__}")
        event_id = obj.get("EventId")
        if not isinstance(event_id, str) or not event_id.strip():
            raise InvalidDocument("an event has no EventId string")
        if strict:
            for name in ("EventStatus", "EventType"):
                value = obj.get(name)
                if not isinstance(value, str) or not value.strip():
                    raise InvalidDocument(f"event {event_id} has no {name} string")
            resources = obj.get("Resources", [])
            if not isinstance(resources, list) or not all(isinstance(r, str) for r in resources):
                raise InvalidDocument(
                    f"event {event_id} has Resources that are not a list of strings"
                )
        notes = _Notes(prefix)
        resource_type = _optional_text(obj, "ResourceType", notes)
        return cls(
            event_id=event_id.strip(),
            event_type=_text(obj, "EventType", notes),
            status=_text(obj, "EventStatus", notes),
            resource_type=resource_type if resource_type is not None else "VirtualMachine",
            resources=_resources(obj, notes),
            not_before=_not_before(obj, notes),
            description=_optional_text(obj, "Description", notes),
            event_source=_optional_text(obj, "EventSource", notes),
            duration_in_seconds=_duration(obj, notes),
            # PascalCase keys are IMDS's own; camelCase ones are the contract's additions.
            raw={k: v for k, v in obj.items() if isinstance(k, str) and k[:1].isupper()},
            warnings=notes.done(),
        )

    def to_imds(self) -> dict[str, Any]:
        """The event as IMDS sent it (round-trips through durable state)."""
        return dict(self.raw)


def read_incarnation(value: object, notes: list[str], name: str) -> int | None:
    """A DocumentIncarnation (or a message's documentIncarnation): an integer, else None with a
    warning in ``notes`` (real IMDS always sends an integer; one odd field hides nothing)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if value is not None:
        notes.append(f"{name}: {show(value)} is not an integer: read as null")
    return None


@dataclass(frozen=True)
class Document:
    incarnation: int | None
    events: tuple[ScheduledEvent, ...]
    # What reading the document normalised outside its events (each event has its own).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def from_imds(cls, obj: object) -> Document:
        """:class:`InvalidDocument` only for what makes the document unusable: not an object,
        no Events list, an event that is not an object or has no EventId."""
        if not isinstance(obj, Mapping):
            raise InvalidDocument(f"the document is not a JSON object: {type(obj).__name__}")
        events = obj.get("Events")
        if not isinstance(events, list):
            raise InvalidDocument("Events is missing or not a list")
        notes: list[str] = []
        value = obj.get("DocumentIncarnation")
        if value is None:
            missing = "DocumentIncarnation" not in obj
            notes.append(f"DocumentIncarnation: {'missing' if missing else 'null'}: read as null")
        incarnation = read_incarnation(value, notes, "DocumentIncarnation")
        parsed: list[ScheduledEvent] = []
        seen: set[str] = set()
        for item in events:
            event = ScheduledEvent.from_imds(item, strict=False)
            if event.key in seen:  # one EventId twice (e.g. in two cases): the first one wins
                continue
            seen.add(event.key)
            parsed.append(event)
        return cls(incarnation=incarnation, events=tuple(parsed), warnings=tuple(notes))
