"""The lifecycle of one scheduled event as every observer derives it, and its message ids (pure).

Two places turn observations of an event into contract transitions: the forwarder on each VM
(successive IMDS documents) and the Event Grid ingestion function (successive notifications).
Both use this module, so that the same transition observed by both, by the N VMs of an
availability set, or by one forwarder before and after a restart gets the same Service Bus
``message_id`` and duplicate detection keeps one copy, while two *distinct* transitions never
share an id.

An id is built only from what every observer of the event sees the same way:

- the EventId (``ref``: the lower-case GUID; a digest for an EventId that is not a short safe
  token, so that ids and session ids stay within Service Bus's 128 characters);
- the transition;
- the **appearance**: 1 the first time the EventId is seen, one more each time it comes back
  after it ended (vanished: Cancelled or Completed). ``Scheduled``, ``Started``, ``Completed``,
  ``Cancelled`` and ``Approved`` are ``<ref>:<Transition>:<appearance>``;
- for ``Updated``, the event's **resulting content** (a digest of the watched fields, compared
  as values: RFC 1123 and ISO 8601 spellings of one NotBefore are one NotBefore) and how often
  that content has become current within this appearance:
  ``<ref>:Updated:<appearance>:<digest>:<occurrence>``. NotBefore A -> B -> A -> B is three
  Updated with three ids (B#1, A#2, B#2); an observer that saw only A -> B reports B#1, the
  same id as the first, so its late copy is dropped rather than undoing what came after it.

Never from per-VM facts (DocumentIncarnation, observation time, the VM's name). The one
exception is ``Measured`` (:func:`measured_id`), which is not a lifecycle transition but one VM's
report of what it measured: ``<ref>:Measured:<appearance>:<observer digest>``, one per VM of a set
and per appearance, so duplicate detection collapses only that VM's own copies (restarts).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sebridge.imds import ScheduledEvent

# Fields whose change on a Scheduled event is an Updated transition, in reporting order. The
# one definition: the forwarder's diff, the Event Grid ingestion and the IMDS simulator's
# expected-transitions check all read it.
WATCHED_FIELDS = (
    "NotBefore",
    "Resources",
    "DurationInSeconds",
    "Description",
    "EventType",
    "EventSource",
)

# The transitions derived from observing an event (Approved, Prepared, Held and Heartbeat are
# reported by whoever does them).
SCHEDULED = "Scheduled"
UPDATED = "Updated"
STARTED = "Started"
COMPLETED = "Completed"
CANCELLED = "Cancelled"
APPROVED = "Approved"
_ENDS = (COMPLETED, CANCELLED)
_OPENS = (SCHEDULED, STARTED)

DIGEST_LENGTH = 12  # hex characters (48 bits): per event, collisions are out of reach
MAX_VERSIONS = 256  # distinct contents remembered per appearance (the oldest are forgotten)
_SAFE_REF = re.compile(r"[0-9a-z][0-9a-z._-]{0,63}")
# <ref>:<Transition>:<appearance>, then ":" (an Updated's content, a derived id's digest), "|"
# (a forwarder's preparation cause) or the end. Nine digits at most: an old derived id's
# 16-character digest is never read as an appearance.
_APPEARANCE_ID = re.compile(
    r"^[^:|]+:(?:Scheduled|Updated|Started|Completed|Cancelled|Approved|Prepared|Held|Measured)"
    r":([0-9]{1,9})(?=[:|]|$)"
)


def event_ref(event_id: str) -> str:
    """The EventId as it appears in message and session ids.

    IMDS EventIds are GUIDs, in any case: their lower-case form. Anything else (too long, or
    with characters that do not belong in an id) is replaced by ``x-`` and a digest of it, the
    same for every observer.
    """
    key = event_id.strip().lower()
    if _SAFE_REF.fullmatch(key):
        return key
    raw = key.encode("utf-8", "surrogatepass")
    return "x-" + hashlib.sha256(raw).hexdigest()[:32]


def comparable(event: ScheduledEvent, name: str) -> object:
    """A watched field as a value: equal values are one content, however they are spelled."""
    if name == "NotBefore":
        if event.not_before is not None:
            return event.not_before.isoformat()
        raw = event.raw.get("NotBefore", "")
        return raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
    if name == "Resources":
        return sorted(r.lower() for r in event.resources)  # VM names are case-insensitive
    if name == "DurationInSeconds":
        return event.duration_in_seconds
    if name in ("EventType", "EventSource"):
        value = event.raw.get(name)
        return value.strip().lower() if isinstance(value, str) else value
    return event.raw.get(name)


def field_changes(before: ScheduledEvent, after: ScheduledEvent) -> dict[str, dict[str, Any]]:
    """The watched fields that differ, with their IMDS values before and after."""
    return {
        name: {"from": before.raw.get(name), "to": after.raw.get(name)}
        for name in WATCHED_FIELDS
        if comparable(before, name) != comparable(after, name)
    }


def content_digest(event: ScheduledEvent) -> str:
    """A digest of the event's watched fields, as values."""
    values = [comparable(event, name) for name in WATCHED_FIELDS]
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), default=str)
    raw = canonical.encode("utf-8", "surrogatepass")
    return hashlib.sha256(raw).hexdigest()[:DIGEST_LENGTH]


@dataclass(frozen=True)
class Life:
    """What an observer remembers of one EventId, for the ids of its next transitions."""

    appearance: int = 1
    versions: Mapping[str, int] = field(default_factory=dict)  # content digest -> occurrences
    ended: bool = False  # Completed or Cancelled was reported for this appearance

    def to_json(self) -> dict[str, Any]:
        return {"appearance": self.appearance, "versions": dict(self.versions), "ended": self.ended}

    @classmethod
    def from_json(cls, obj: object) -> Life:
        """Strict: a damaged record raises ValueError (the caller starts that event afresh)."""
        if not isinstance(obj, Mapping):
            raise ValueError("a life record is not an object")
        appearance = obj.get("appearance")
        if isinstance(appearance, bool) or not isinstance(appearance, int):
            raise ValueError("appearance is not an integer")
        if not 1 <= appearance <= 1_000_000:
            raise ValueError("appearance is out of range")
        versions = obj.get("versions", {})
        if not isinstance(versions, Mapping) or len(versions) > MAX_VERSIONS:
            raise ValueError("versions is not a small object")
        checked: dict[str, int] = {}
        for digest, count in versions.items():
            if not isinstance(digest, str) or len(digest) != DIGEST_LENGTH:
                raise ValueError("a version digest is malformed")
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 10**9:
                raise ValueError("a version count is out of range")
            checked[digest] = count
        ended = obj.get("ended", False)
        if not isinstance(ended, bool):
            raise ValueError("ended is not a boolean")
        return cls(appearance, checked, ended)


def message_id(
    ref: str,
    transition: str,
    appearance: int = 1,
    *,
    digest: str | None = None,
    occurrence: int | None = None,
) -> str:
    """``<ref>:<Transition>:<appearance>``, with ``:<digest>:<occurrence>`` for Updated."""
    base = f"{ref}:{transition}:{appearance}"
    if transition == UPDATED:
        if digest is None or occurrence is None:
            raise ValueError("an Updated id needs the content digest and its occurrence")
        return f"{base}:{digest}:{occurrence}"
    return base


def appearance_of(message_id: str | None) -> int | None:
    """The appearance a message id (or a cause that starts with one) names, by the event's
    life: ``<ref>:<Transition>:<appearance>...``, a derived id ``<ref>:Prepared:<appearance>:
    <digest>`` too (sebridge.contract.events.derived_message_id). None when it names none (a
    heartbeat, an Event Grid id, a derived id from before ids carried it)."""
    found = _APPEARANCE_ID.match(message_id or "")
    if found is None:
        return None
    number = int(found.group(1))
    return number if number >= 1 else None


MEASURED = "Measured"


def observer_digest(vm_name: str) -> str:
    """The observing VM in a ``Measured`` id: 16 hex characters of SHA-256 over its lower-case
    name (a VM name may hold characters an id should not; it fits in any case)."""
    return hashlib.sha256(vm_name.lower().encode("utf-8", "surrogatepass")).hexdigest()[:16]


def measured_id(ref: str, appearance: int, vm_name: str) -> str:
    """``<ref>:Measured:<appearance>:<observer digest>``: one VM's measurement of one appearance
    of the event. Per observer on purpose: every VM of a set measures its own impact."""
    return f"{ref}:{MEASURED}:{appearance}:{observer_digest(vm_name)}"


def advance(life: Life | None, transition: str, event: ScheduledEvent) -> tuple[Life, str]:
    """The life after ``transition`` of ``event`` (as it is now), and that transition's id.

    ``life`` is what was remembered of the EventId (None: never seen). Scheduled or Started of
    an EventId whose last appearance ended opens the next appearance.
    """
    ref = event_ref(event.event_id)
    if life is None:
        life = Life(appearance=1)
    elif life.ended and transition in _OPENS:
        life = Life(appearance=life.appearance + 1)
    digest = content_digest(event)
    if transition in _OPENS and not life.versions:
        life = Life(life.appearance, {digest: 1})
        return life, message_id(ref, transition, life.appearance)
    if transition == UPDATED:
        versions = dict(life.versions)
        occurrence = versions.get(digest, 0) + 1
        versions.pop(digest, None)
        versions[digest] = occurrence  # most recent last, so the oldest are forgotten first
        while len(versions) > MAX_VERSIONS:
            versions.pop(next(iter(versions)))
        life = Life(life.appearance, versions, life.ended)
        return life, message_id(ref, UPDATED, life.appearance, digest=digest, occurrence=occurrence)
    if transition in _ENDS:
        life = Life(life.appearance, life.versions, ended=True)
    return life, message_id(ref, transition, life.appearance)
