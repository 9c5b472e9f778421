"""history: every event's timeline, kept after the cards are posted (core).

Each verified message on the ``history`` subscription (every transition but Heartbeat) becomes
one :class:`Entry` of its event: a lifecycle transition (Scheduled, Updated, Started, Completed,
Cancelled, by the forwarder or Event Grid) or an action (Prepared by lb-pools, hooks or the
drain probe; Held by lb-pools; Approved, by whom and why); what reaches no topic (lb-pools
putting VMs back) is recorded through ``functions.shared.ports.ActionRecorder``.

**Keyed by scope.** An entry belongs to the event *as one scope saw it*: the EventId and the
verified placement of the observer (its availability set, else its scale set, else the VM
itself: :attr:`functions.shared.verified.VerifiedMessage.placement`), the only VMs IMDS shows
that event to. A verified VM of another availability set that sends a message with a real
event's EventId writes into an entry of its own scope and can never touch this one's timeline,
summary or calendar entry (the PagerDuty dedup keys are keyed the same way). An event that
several scopes report is several entries.

**Redelivery.** An entry's key derives from the message id (and its appearance), never from
per-observer facts, and it is written only if absent: a redelivered or duplicated message
changes nothing. Each entry carries when the app recorded it (``recorded``, the app's clock),
which retention measures; the observer's time (``at``) is what the timeline shows, never later
than ``recorded`` (:func:`bounded_time`).

**Order: the event's life, never an observer's clock** (:func:`life_key`). Each entry's
appearance comes from its message id (an action's from its cause's:
sebridge.contract.events.derived_message_id); within an appearance Scheduled comes before
Updated before Started before the end, and two entries of one phase (two Updateds) come in the
order the app recorded them, as functions.shared.event_record orders them. Forwarders' clocks
differ, and a VM can date a message 2099: no time an observer gave orders anything.

**The summary** (:class:`EventSummary`) is derived from the *set* of entries, never from the
order they arrived in (but for two Updateds of one appearance, above): the state is the
furthest transition seen (Completed or Cancelled over Started over Scheduled), the content
(NotBefore, duration, VMs) that of the Scheduled or Updated latest in the event's life. It is
written under its ETag after the entries were read (:meth:`History.refresh`), so the last
summary written always saw every entry written before it. It is storable by construction:
every text is cut at a character boundary to a length whose JSON form fits one Azure Table
string property (32,767 UTF-16 units) whatever the characters, every list is bounded, nothing
is kept twice (:func:`summary_properties`), and a summary read back equals the one derived, so
a redelivery writes nothing.

**Bounds** (docs/monitoring.md): :data:`MAX_VMS` VM names per entry and per summary,
:data:`MAX_APPEARANCES` appearances per summary (the most recently recorded), entries read per
event scope bounded by the store with the lifecycle rows never crowded out by the bulk ones,
:data:`MAX_TEXT` characters of Description and reasons.

Storage faults are retried within a window (functions.shared.transient) and then raised, so
Service Bus redelivers at the window's pace. Retention deletes events whose last entry was
*recorded* longer than ``HISTORY_RETENTION_DAYS`` ago, at most :data:`PURGE_BATCH` per run and
one run per :data:`PURGE_EVERY` per process, by the writes themselves (no timer).

Nothing secret is stored: the fields kept are picked one by one (no seal, no token, no URL).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from functions.shared import names
from functions.shared.transient import RetryWindow, TransientFault, within
from functions.shared.verified import VerifiedMessage
from sebridge import lifecycle, times
from sebridge.contract.events import Transition, TransitionMessage
from sebridge.imds import isoformat_utc

log = logging.getLogger("sebridge.functions.history")

SUMMARY_PREFIX = "sebridge.history "
SUMMARY_LOGGER = "sebridge.functions.history.summary"
summary_log = logging.getLogger(SUMMARY_LOGGER)

PROPERTY_UNITS = 32_767  # an Azure Table string property: 64 KiB of UTF-16
MAX_TEXT = 2000  # Description and reasons, characters (code points)
MAX_NAME = 128  # other texts
MAX_VM_NAME = 80  # a VM (1-64) or an availability set (1-80), Azure's naming rules
MAX_SCOPE = 400  # a placement: an ARM id
MAX_POOL = 400  # a backend pool's ARM id
MAX_VMS = 200  # VM names per entry and per summary: an availability set's maximum
MAX_APPEARANCES = 20  # per summary, the most recently recorded
MAX_SOURCES = 4  # distinct sources named per appearance
MAX_CHANGED = 8  # field names an Updated lists
MAX_DETAILS = 8  # keys of an action's details
MAX_APPEARANCE_NUMBER = 1_000_000
MAX_SUMMARY_ATTEMPTS = 5
PURGE_EVERY = timedelta(minutes=10)
PURGE_BATCH = 20
MAX_METHODS = 4  # distinct measurement methods per appearance (others read as "unknown")
MAX_PENDING = 1000  # actions kept in memory while the store is down

# Azure Table's datetime range (1601-01-01 to 9999-12-31); every stored time is held to it.
EARLIEST = datetime(1601, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)

TRANSITIONS = ("Scheduled", "Updated", "Started", "Completed", "Cancelled")
# NotRestored: lb-pools could not put VMs back (a pool deleted, ARM refused the restore for good)
ACTIONS = ("Prepared", "Held", "Approved", "Restored", "NotRestored")
# Measured: one VM's report of what it measured of the event (contract: one message per VM).
REPORTS = ("Measured",)
NAMES = (*TRANSITIONS, *ACTIONS, *REPORTS)
STATES = ("Scheduled", "Started", "Completed", "Cancelled")


class SummaryConflict(TransientFault):
    """Someone else wrote the event's summary since it was read (read again and retry)."""


class StoreUnavailable(TransientFault):
    """The store did not answer, or answered 408, 429 or 5xx (the adapter raises it)."""


def event_key(event_id: str) -> str:
    """The event's key in the store: the lower-case EventId (a GUID), or a digest of anything
    else (:func:`sebridge.lifecycle.event_ref`, as in message ids), so that no character from a
    message reaches a key or a URL."""
    return lifecycle.event_ref(event_id)


def summary_key(event: str, scope_key: str) -> str:
    """The key of one scope's entry of an event: ``<event key>.<scope digest>``."""
    return f"{event}.{scope_key}"


def _text(value: object, limit: int = MAX_NAME) -> str:
    """Printable text of at most ``limit`` code points (control characters but newline and tab
    dropped, lone surrogates replaced): its JSON form takes at most ``2 * limit + 2`` UTF-16
    units, whatever the characters (an astral one is 2 units; an escaped one 2 characters)."""
    if not isinstance(value, str):
        return ""
    clean = "".join(ch for ch in value if ch >= " " or ch in "\n\t")
    clean = clean.encode("utf-8", "replace").decode("utf-8")
    return clean if len(clean) <= limit else clean[: limit - 1] + "\u2026"


def utf16_units(text: str) -> int:
    """The length Azure Table counts a string property in."""
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _json(value: object) -> str:
    # ensure_ascii=False: an astral character stays 2 UTF-16 units (escaped, it would be 12)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def clamp_time(moment: datetime) -> datetime:
    """``moment`` in UTC, held to what Azure Table can store (1601 to 9999)."""
    return times.clamp(moment, EARLIEST, LATEST)


def shifted(moment: datetime, delta: timedelta) -> datetime:
    """``moment + delta`` held to 1601..9999 (never an OverflowError)."""
    return times.shifted(moment, delta, EARLIEST, LATEST)


def _time(value: object) -> datetime | None:
    """A stored time back (our own ISO 8601 text); None for anything else."""
    moment = times.parse_iso(value)
    return clamp_time(moment) if moment is not None else None


def _iso(value: datetime | None) -> str | None:
    return isoformat_utc(value) if value is not None else None


def time_rank(moment: datetime) -> int:
    """Microseconds since 1601-01-01 of a (clamped) time: what the time indexes sort by."""
    return (clamp_time(moment) - EARLIEST) // timedelta(microseconds=1)


def _seconds(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return int((later - earlier).total_seconds())


def bounded_time(observed: datetime, recorded: datetime | None) -> datetime:
    """The time an entry shows: the observer's, never later than when the app recorded it (a
    VM's clock ahead, or a message dated 2099, shows the receive time). An earlier one is kept
    as it is, but no time an observer gave orders anything (:func:`life_key`)."""
    observed = clamp_time(observed)
    return observed if recorded is None else min(observed, clamp_time(recorded))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _vm_names(values: object) -> tuple[str, ...]:
    if not isinstance(values, list | tuple):
        return ()
    return tuple(_text(v, MAX_VM_NAME) for v in values if isinstance(v, str))[:MAX_VMS]


@dataclass(frozen=True)
class Entry:
    """One transition or action of one event in one scope, as stored (one row)."""

    event_id: str  # the EventId as the message carried it
    key: str  # stable per message: a redelivery has the same key
    name: str  # a transition (TRANSITIONS) or an action (ACTIONS)
    at: datetime  # when it was observed or done (the message's time, at most ``recorded``)
    source: str  # forwarder, event-grid, lb-pools, hooks, drain-probe...
    scope: str = ""  # the verified placement (lower-case ARM id)
    scope_key: str = ""  # its digest (VerifiedMessage.placement_digest)
    recorded: datetime | None = None  # when the app recorded it (its own clock)
    appearance: int = 0  # from the message id (its cause's for an action); 0: it names none
    event_type: str = ""
    status: str = ""
    not_before: datetime | None = None
    duration_seconds: int | None = None
    resources: tuple[str, ...] = ()
    description: str = ""
    event_source: str = ""
    observer: str = ""  # the observing VM (or Event Grid's resource)
    resource_group: str = ""
    subscription_id: str = ""
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_transition(self) -> bool:
        return self.name in TRANSITIONS

    @property
    def summary_key(self) -> str:
        return summary_key(event_key(self.event_id), self.scope_key)

    @property
    def recorded_at(self) -> datetime:
        return self.recorded or self.at

    def to_record(self) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "key": self.key,
            "name": self.name,
            "at": _iso(self.at),
            "source": self.source,
            "scope": self.scope,
            "scopeKey": self.scope_key,
            "recorded": _iso(self.recorded),
            "appearance": self.appearance,
            "eventType": self.event_type,
            "status": self.status,
            "notBefore": _iso(self.not_before),
            "durationInSeconds": self.duration_seconds,
            "resources": list(self.resources),
            "description": self.description,
            "eventSource": self.event_source,
            "observer": self.observer,
            "resourceGroup": self.resource_group,
            "subscriptionId": self.subscription_id,
            "details": dict(self.details),
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Entry:
        """Raises ValueError for a record that is not one (the store skips it, logged)."""
        at = _time(record.get("at"))
        name = record.get("name")
        if at is None or name not in NAMES:
            raise ValueError("not a history entry")
        duration = _int(record.get("durationInSeconds"))
        appearance = _int(record.get("appearance"))
        details = record.get("details")
        recorded = _time(record.get("recorded"))
        return cls(
            event_id=_text(record.get("eventId")),
            key=_text(record.get("key")),
            name=str(name),
            at=bounded_time(at, recorded),
            source=_text(record.get("source")),
            scope=_text(record.get("scope"), MAX_SCOPE),
            scope_key=_text(record.get("scopeKey"), 32),
            recorded=recorded,
            appearance=min(appearance, MAX_APPEARANCE_NUMBER)
            if appearance is not None and appearance >= 0
            else 0,
            event_type=_text(record.get("eventType")),
            status=_text(record.get("status")),
            not_before=_time(record.get("notBefore")),
            duration_seconds=duration if duration is not None and abs(duration) < 2**31 else None,
            resources=_vm_names(record.get("resources")),
            description=_text(record.get("description"), MAX_TEXT),
            event_source=_text(record.get("eventSource")),
            observer=_text(record.get("observer")),
            resource_group=_text(record.get("resourceGroup")),
            subscription_id=_text(record.get("subscriptionId")),
            details=dict(details) if isinstance(details, dict) else {},
        )


def entry_properties(entry: Entry) -> dict[str, str]:
    """The entry as the string properties of one table row, each within
    :data:`PROPERTY_UNITS` by construction: the lists of VM names (up to 200 names of up to 80
    characters each) in their own properties, the rest (up to two texts of 2,000 characters
    and short fields) in ``record``."""
    record = entry.to_record()
    resources = record.pop("resources")
    details = dict(record["details"])
    vms = details.pop("vms", None)
    record["details"] = details
    properties = {"record": _json(record), "resources": _json(resources)}
    if vms is not None:
        properties["vms"] = _json(vms)
    return properties


def entry_from_properties(properties: Mapping[str, Any]) -> Entry:
    """:func:`entry_properties` read back; ValueError (or TypeError, KeyError) if it is not."""
    record = json.loads(properties["record"])
    if not isinstance(record, dict):
        raise ValueError("not a history entry")
    raw_resources = properties.get("resources")
    record["resources"] = json.loads(raw_resources) if isinstance(raw_resources, str) else []
    raw_vms = properties.get("vms")
    if isinstance(raw_vms, str) and isinstance(record.get("details"), dict):
        record["details"]["vms"] = json.loads(raw_vms)
    entry = Entry.from_record(record)
    if entry.name in ("Prepared", "Held") and "vms" in entry.details:
        vms = list(_vm_names(entry.details["vms"]))
        entry = replace(entry, details={**entry.details, "vms": vms})
    return entry


# ---- messages to entries ------------------------------------------------------------------
def entry_key(name: str, cause: str, appearance: int = 0) -> str:
    """The row key of ``name`` caused by message ``cause``: the same message, the same row.
    Sorted by name, then appearance, so each kind's rows can be read on their own."""
    digest = hashlib.sha256(cause.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{name.lower()}-{appearance:07d}-{digest}"


def _source(message: TransitionMessage) -> str:
    if isinstance(message.data.get("eventGrid"), dict):
        return "event-grid"
    if message.transition is Transition.PREPARED:
        prepared = message.data.get("prepared")
        by = prepared.get("preparedBy") if isinstance(prepared, dict) else None
        return _text(by) or "unknown"
    if message.source.startswith("urn:sebridge:function:"):
        return _text(message.source.removeprefix("urn:sebridge:function:"))
    return "forwarder"


def measured_impact(message: TransitionMessage) -> dict[str, Any] | None:
    """``data.impact`` of a Completed or a Measured (optional), as the contract's reader
    reads it."""
    impact = message.impact
    if impact is None:
        return None
    return {"measuredSeconds": round(impact.seconds, 3), "method": _text(impact.method, 40)}


def _details(message: TransitionMessage) -> dict[str, Any]:
    data = message.data
    transition = message.transition
    if transition is Transition.APPROVED:
        approval = data.get("approval")
        approval = approval if isinstance(approval, dict) else {}
        return {
            "requestedBy": _text(approval.get("requestedBy")),
            "reason": _text(approval.get("reason"), MAX_TEXT),
        }
    if transition is Transition.PREPARED:
        prepared = data.get("prepared")
        prepared = prepared if isinstance(prepared, dict) else {}
        return {
            "preparedBy": _text(prepared.get("preparedBy")),
            "vms": list(_vm_names(prepared.get("vms"))),
        }
    if transition is Transition.HELD:
        held = data.get("held")
        held = held if isinstance(held, dict) else {}
        healthy, minimum = _int(held.get("healthy")), _int(held.get("minimum"))
        return {
            "pool": _text(held.get("pool"), MAX_POOL),
            "healthy": healthy if healthy is not None and abs(healthy) < 2**31 else None,
            "minimum": minimum if minimum is not None and abs(minimum) < 2**31 else None,
            "vms": list(_vm_names(held.get("vms"))),
        }
    if transition is Transition.UPDATED:
        changes = data.get("changes")
        if not isinstance(changes, dict):
            return {}
        return {"changed": sorted(_text(k, 40) for k in list(changes)[:MAX_CHANGED])}
    if transition in (Transition.COMPLETED, Transition.MEASURED):
        impact = measured_impact(message)
        return {"impact": impact} if impact else {}
    return {}


def _plain(details: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow's details of an action, held to a few plain values."""
    plain: dict[str, Any] = {}
    for key, value in list(details.items())[:MAX_DETAILS]:
        number = (isinstance(value, int) and abs(value) < 2**53) or (
            isinstance(value, float) and math.isfinite(value)
        )
        if isinstance(value, bool) or value is None or number:
            plain[_text(key, 40)] = value
        elif isinstance(value, str):
            plain[_text(key, 40)] = _text(value)
    return plain


def _entry(
    message: TransitionMessage, scope: str, scope_key: str, recorded: datetime
) -> Entry | None:
    event = message.event
    if event is None or message.transition is Transition.HEARTBEAT:
        return None
    cause = message.message_id or f"{event.key}:{message.transition.value}"
    # Where in the event's life: the appearance its id names (a Prepared's or Held's id names
    # its cause's, sebridge.contract.events.derived_message_id), never an observer's clock.
    appearance = min(lifecycle.appearance_of(cause) or 0, MAX_APPEARANCE_NUMBER)
    duration = event.duration_in_seconds
    recorded = clamp_time(recorded)
    # The key keeps 0 for actions (as before ids named the appearance): a redelivery of an
    # action recorded earlier finds its row.
    keyed = appearance if message.transition.value in (*TRANSITIONS, "Approved", *REPORTS) else 0
    return Entry(
        event_id=_text(event.event_id),
        key=entry_key(message.transition.value, cause, keyed),
        name=message.transition.value,
        at=bounded_time(message.time or recorded, recorded),
        source=_source(message),
        scope=_text(scope, MAX_SCOPE),
        scope_key=scope_key,
        recorded=recorded,
        appearance=appearance,
        event_type=_text(event.event_type),
        status=_text(event.status),
        not_before=clamp_time(event.not_before) if event.not_before else None,
        duration_seconds=duration if duration is not None and abs(duration) < 2**31 else None,
        resources=_vm_names(list(event.resources)),
        description=_text(event.description, MAX_TEXT),
        event_source=_text(event.event_source),
        observer=_text(message.observer.vm_name),
        resource_group=_text(message.observer.resource_group),
        subscription_id=_text(message.observer.subscription_id),
        details=_details(message),
    )


def entry_for(verified: VerifiedMessage, recorded: datetime) -> Entry | None:
    """The entry a verified topic message makes, in its verified scope, recorded at
    ``recorded`` (the app's clock); None for Heartbeat, which is no event's."""
    return _entry(verified.message, verified.placement, verified.placement_digest, recorded)


def action_entry(
    verified: VerifiedMessage, name: str, at: datetime, source: str, details: Mapping[str, Any]
) -> Entry | None:
    """An action a workflow reports through an ``ActionRecorder`` (``Restored``), keyed by the
    message that caused it, in that message's scope."""
    base = entry_for(verified, at)
    if base is None or name not in ACTIONS:
        return None
    cause = verified.message.message_id or base.key
    return replace(
        base,
        key=entry_key(name, cause),
        name=name,
        at=bounded_time(at, base.recorded),
        source=_text(source),
        appearance=base.appearance,  # the cause's (a Completed's id names it)
        details=_plain(details),
    )


# ---- entries to a summary -----------------------------------------------------------------
@dataclass(frozen=True)
class VmImpact:
    """What one VM of the event measured of it (its Completed's or its Measured's impact)."""

    vm: str  # lower case, one of the summary's VMs
    seconds: float
    method: str

    def to_json(self, announced: int | None) -> dict[str, Any]:
        return {
            "vm": self.vm,
            "announcedSeconds": announced,
            "measuredSeconds": self.seconds,
            "method": self.method or None,
        }


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def vm_impacts(entries: Iterable[Entry], vms: frozenset[str]) -> tuple[VmImpact, ...]:
    """Each VM's measurement, from every Completed and Measured entry that carries one (the
    topic keeps one Completed of a set, each VM's Measured besides): the largest per VM,
    only VMs of the summary, at most :data:`MAX_METHODS` distinct methods (the rest read as
    ``unknown``), sorted by VM."""
    best: dict[str, VmImpact] = {}
    for entry in entries:
        impact = entry.details.get("impact") if entry.name in ("Completed", *REPORTS) else None
        if not isinstance(impact, dict):
            continue
        seconds = _number(impact.get("measuredSeconds"))
        vm = _text(entry.observer.lower(), MAX_VM_NAME)
        if seconds is None or vm not in vms:
            continue
        found = VmImpact(vm, seconds, _text(impact.get("method"), 40))
        held = best.get(vm)
        if held is None or (found.seconds, found.method) > (held.seconds, held.method):
            best[vm] = found
    methods = sorted({m.method for m in best.values()})[:MAX_METHODS]
    return tuple(
        m if m.method in methods else replace(m, method="unknown")
        for m in sorted(best.values(), key=lambda m: m.vm)
    )


@dataclass(frozen=True)
class Appearance:
    """One appearance of an event (it comes back after it ended: Scheduled again)."""

    number: int
    state: str
    event_type: str
    not_before: datetime | None
    duration_seconds: int | None
    resources: tuple[str, ...]  # lower case, each one of the summary's VMs
    description: str
    event_source: str
    first_seen: datetime
    last_seen: datetime
    scheduled_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    updates: int  # distinct Updated transitions: the calendar's SEQUENCE
    notice_seconds: int | None  # first NotBefore minus the first Scheduled
    approved_at: datetime | None = None
    approved_by: str = ""
    approval_reason: str = ""
    prepared_at: datetime | None = None
    prepared_by: str = ""
    held_at: datetime | None = None
    held: bool = False  # held and not prepared since
    held_pool: str = ""
    restored_at: datetime | None = None
    measured_seconds: float | None = None  # the largest of the VMs' (else the Completed's)
    measure_method: str = ""
    sources: tuple[str, ...] = ()
    measured_vms: tuple[VmImpact, ...] = ()  # each VM's own measurement

    @property
    def announced_seconds(self) -> int | None:
        d = self.duration_seconds
        return d if d is not None and d >= 0 else None

    @property
    def when(self) -> datetime:
        """When it is (or was) to happen: NotBefore, else when it started, else first seen;
        once started, never later than when it started (an event approved early starts before
        its NotBefore; a NotBefore a VM of the scope invented, 2099 say, is then outlived by
        the genuine Started: the calendar and the listing place the event where it happened)."""
        if self.started_at is not None:
            return min(self.not_before or self.started_at, self.started_at)
        return self.not_before or self.first_seen

    def to_json(self) -> dict[str, Any]:
        return {
            "appearance": self.number,
            "state": self.state,
            "eventType": self.event_type,
            "notBefore": _iso(self.not_before),
            "durationInSeconds": self.duration_seconds,
            "resources": list(self.resources),
            "description": self.description,
            "eventSource": self.event_source,
            "firstSeen": _iso(self.first_seen),
            "lastSeen": _iso(self.last_seen),
            "scheduledAt": _iso(self.scheduled_at),
            "startedAt": _iso(self.started_at),
            "endedAt": _iso(self.ended_at),
            "updates": self.updates,
            "noticeSeconds": self.notice_seconds,
            "approvedAt": _iso(self.approved_at),
            "approvedBy": self.approved_by,
            "approvalReason": self.approval_reason,
            "approvalSeconds": _seconds(self.approved_at, self.scheduled_at),
            "preparedAt": _iso(self.prepared_at),
            "preparedBy": self.prepared_by,
            "heldAt": _iso(self.held_at),
            "held": self.held,
            "heldPool": self.held_pool,
            "restoredAt": _iso(self.restored_at),
            "impact": {
                "announcedSeconds": self.announced_seconds,
                "measuredSeconds": self.measured_seconds,
                "method": self.measure_method or None,
                "measured": self.measured_seconds is not None,
                "vms": [m.to_json(self.announced_seconds) for m in self.measured_vms],
            },
            "sources": list(self.sources),
        }

    def to_record(self, vms: Sequence[str]) -> dict[str, Any]:
        """The stored form: every field once, the VMs as positions in the summary's list."""
        position = {vm: i for i, vm in enumerate(vms)}
        methods = sorted({m.method for m in self.measured_vms})
        return {
            "number": self.number,
            "state": self.state,
            "eventType": self.event_type,
            "notBefore": _iso(self.not_before),
            "durationInSeconds": self.duration_seconds,
            "resources": [position[vm] for vm in self.resources],
            "description": self.description,
            "eventSource": self.event_source,
            "firstSeen": _iso(self.first_seen),
            "lastSeen": _iso(self.last_seen),
            "scheduledAt": _iso(self.scheduled_at),
            "startedAt": _iso(self.started_at),
            "endedAt": _iso(self.ended_at),
            "updates": self.updates,
            "noticeSeconds": self.notice_seconds,
            "approvedAt": _iso(self.approved_at),
            "approvedBy": self.approved_by,
            "approvalReason": self.approval_reason,
            "preparedAt": _iso(self.prepared_at),
            "preparedBy": self.prepared_by,
            "heldAt": _iso(self.held_at),
            "held": self.held,
            "heldPool": self.held_pool,
            "restoredAt": _iso(self.restored_at),
            "measuredSeconds": self.measured_seconds,
            "measureMethod": self.measure_method,
            "sources": list(self.sources),
            # Each VM's: [its position in the summary's VMs, seconds, index in measureMethods]
            "measureMethods": methods,
            "measuredVms": [
                [position[m.vm], m.seconds, methods.index(m.method)] for m in self.measured_vms
            ],
        }

    @classmethod
    def from_record(cls, obj: Mapping[str, Any], vms: Sequence[str]) -> Appearance:
        first_seen = _time(obj.get("firstSeen"))
        if first_seen is None or obj.get("state") not in STATES:
            raise ValueError("not an appearance")
        number = _int(obj.get("number"))
        measured = obj.get("measuredSeconds")
        resources = obj.get("resources") or []
        methods = [_text(m, 40) for m in obj.get("measureMethods") or [] if isinstance(m, str)]
        measured_vms: list[VmImpact] = []
        for row in obj.get("measuredVms") or []:
            if not isinstance(row, list) or len(row) != 3:
                continue
            at, seconds, method = _int(row[0]), _number(row[1]), _int(row[2])
            if at is None or not 0 <= at < len(vms) or seconds is None:
                continue
            name = methods[method] if method is not None and 0 <= method < len(methods) else ""
            measured_vms.append(VmImpact(vms[at], seconds, name))
        return cls(
            number=number if number is not None else 1,
            state=str(obj["state"]),
            event_type=_text(obj.get("eventType")),
            not_before=_time(obj.get("notBefore")),
            duration_seconds=_int(obj.get("durationInSeconds")),
            resources=tuple(vms[i] for i in resources if isinstance(i, int) and 0 <= i < len(vms)),
            description=_text(obj.get("description"), MAX_TEXT),
            event_source=_text(obj.get("eventSource")),
            first_seen=first_seen,
            last_seen=_time(obj.get("lastSeen")) or first_seen,
            scheduled_at=_time(obj.get("scheduledAt")),
            started_at=_time(obj.get("startedAt")),
            ended_at=_time(obj.get("endedAt")),
            updates=_int(obj.get("updates")) or 0,
            notice_seconds=_int(obj.get("noticeSeconds")),
            approved_at=_time(obj.get("approvedAt")),
            approved_by=_text(obj.get("approvedBy")),
            approval_reason=_text(obj.get("approvalReason"), MAX_TEXT),
            prepared_at=_time(obj.get("preparedAt")),
            prepared_by=_text(obj.get("preparedBy")),
            held_at=_time(obj.get("heldAt")),
            held=obj.get("held") is True,
            held_pool=_text(obj.get("heldPool"), MAX_POOL),
            restored_at=_time(obj.get("restoredAt")),
            measured_seconds=float(measured)
            if isinstance(measured, int | float) and not isinstance(measured, bool)
            else None,
            measure_method=_text(obj.get("measureMethod"), 40),
            sources=tuple(_text(s) for s in obj.get("sources") or [] if isinstance(s, str))[
                :MAX_SOURCES
            ],
            measured_vms=tuple(measured_vms[:MAX_VMS]),
        )


@dataclass(frozen=True)
class EventSummary:
    """An event as one scope's entries tell it: its appearances, the latest last."""

    event_id: str
    scope: str  # the verified placement the entries came from
    scope_key: str  # its digest
    resource_group: str
    subscription_id: str
    observer: str
    vms: tuple[str, ...]  # lower case, sorted, at most MAX_VMS
    appearances: tuple[Appearance, ...]  # oldest first; never empty
    entries: int  # entries read
    complete: bool  # every entry was read (False: the store's bound cut the read)
    last_recorded: datetime  # the app's clock, for retention

    @property
    def latest(self) -> Appearance:
        return self.appearances[-1]

    @property
    def event_key(self) -> str:
        return event_key(self.event_id)

    @property
    def key(self) -> str:
        return summary_key(self.event_key, self.scope_key)

    @property
    def last_seen(self) -> datetime:
        return max(a.last_seen for a in self.appearances)

    def to_json(self) -> dict[str, Any]:
        """The API's view: the latest appearance's fields at the top, every appearance below."""
        latest = self.latest.to_json()
        return {
            "eventId": self.event_id,
            "id": self.key,
            "scope": self.scope,
            **{k: v for k, v in latest.items() if k != "appearance"},
            "appearance": self.latest.number,
            "resourceGroup": self.resource_group,
            "subscriptionId": self.subscription_id,
            "observer": self.observer,
            "vms": list(self.vms),
            "entries": self.entries,
            "entriesComplete": self.complete,
            "appearances": [a.to_json() for a in self.appearances],
        }


_ORDER = {name: i for i, name in enumerate(NAMES)}


# Where a kind of entry stands in an appearance's life: Scheduled, then Updated (and the
# actions taken on what was announced), then Started, then the end (and what follows it).
_PHASE = {
    "Scheduled": 0,
    "Updated": 1,
    "Prepared": 1,
    "Held": 1,
    "Approved": 1,
    "Started": 2,
    "Completed": 3,
    "Cancelled": 3,
    "Restored": 4,  # what follows the end: lb-pools put the VMs back
    "NotRestored": 4,
    "Measured": 4,  # what a VM measured of it: reported with or after its end
}


def life_key(entry: Entry, appearance: int | None = None) -> tuple[int, int, datetime, int, str]:
    """An entry's place in its event's life, the same whatever clock its observer keeps and
    whatever order the entries arrive in: its appearance (from the message id), its phase
    (Scheduled before Updated before Started before the end), then, within a phase (two
    Updateds of one appearance, say), the order the app recorded them in (its own clock, as
    functions.shared.event_record orders them), then the key."""
    number = entry.appearance if appearance is None else appearance
    return (
        number,
        _PHASE.get(entry.name, 1),
        entry.recorded_at,
        _ORDER.get(entry.name, 99),
        entry.key,
    )


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """Entries in the order of the event's life (:func:`life_key`; an action whose id names
    no appearance where :func:`_appearances` puts it): the timeline as it happened."""
    groups = _appearances(list(entries))
    pairs = sorted(
        ((n, e) for n, group in groups.items() for e in group),
        key=lambda pair: life_key(pair[1], pair[0]),
    )
    return [e for _, e in pairs]


def _appearances(entries: Sequence[Entry]) -> dict[int, list[Entry]]:
    """Entries by appearance: the one its message id names (an action's: its cause's). An
    entry whose id names none (an action recorded before ids named it) goes to the latest
    appearance whose first entry the app recorded at or before it (the app's clock, never the
    observer's)."""
    starts: dict[int, datetime] = {}
    for e in entries:
        if e.appearance > 0:
            starts[e.appearance] = min(starts.get(e.appearance, e.recorded_at), e.recorded_at)
    groups: dict[int, list[Entry]] = {}
    for e in entries:
        number = e.appearance
        if number == 0:
            before = [n for n, at in starts.items() if at <= e.recorded_at]
            number = max(before) if before else (min(starts) if starts else 1)
        groups.setdefault(number, []).append(e)
    return groups


def _earliest(entries: Iterable[Entry], *names: str) -> Entry | None:
    """The first of ``names`` in the appearance's life (one entry per message id)."""
    found = [e for e in entries if e.name in names]
    return min(found, key=life_key) if found else None


def _lower_unique(values: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for value in values:
        seen.setdefault(value.lower(), None)
    return list(seen)


def _content(entries: Sequence[Entry]) -> Entry:
    """The entry an appearance's content comes from: its Scheduled or Updated latest in the
    event's life (:func:`life_key`: an Updated over the Scheduled, two Updateds in the order
    the app recorded them; never by an observer's clock), else its latest transition, else its
    latest entry."""
    transitions = [e for e in entries if e.is_transition]
    content_from = [e for e in transitions if e.name in ("Scheduled", "Updated")] or (
        transitions or list(entries)
    )
    return max(content_from, key=life_key)


def _appearance(number: int, entries: Sequence[Entry], vms: frozenset[str]) -> Appearance:
    present = {e.name for e in entries}
    if "Completed" in present:
        state = "Completed"
    elif "Cancelled" in present:
        state = "Cancelled"
    elif "Started" in present:
        state = "Started"
    else:
        state = "Scheduled"
    transitions = [e for e in entries if e.is_transition]
    content = _content(entries)
    scheduled = _earliest(entries, "Scheduled")
    started = _earliest(entries, "Started")
    ended = _earliest(entries, "Completed", "Cancelled")
    approved = _earliest(entries, "Approved")
    prepared = _earliest(entries, "Prepared")
    held_entries = [e for e in entries if e.name == "Held"]
    # held, then prepared since: in the order the app recorded them (its own clock)
    last_held = max(held_entries, key=life_key) if held_entries else None
    prepared_since = last_held is not None and any(
        e.name == "Prepared" and e.recorded_at >= last_held.recorded_at for e in entries
    )
    restored = _earliest(entries, "Restored")
    first_held = _earliest(entries, "Held")
    completed = _earliest(entries, "Completed")
    impact = completed.details.get("impact") if completed is not None else None
    impact = impact if isinstance(impact, dict) else {}
    measured = impact.get("measuredSeconds")
    per_vm = vm_impacts(entries, vms)
    if per_vm:  # the largest any VM measured, rather than whichever Completed the topic kept
        largest = max(per_vm, key=lambda m: (m.seconds, m.method))
        impact = {"measuredSeconds": largest.seconds, "method": largest.method}
        measured = largest.seconds
    notice = None
    if scheduled is not None and scheduled.not_before is not None:
        notice = _seconds(scheduled.not_before, scheduled.at)
    return Appearance(
        number=number,
        state=state,
        event_type=content.event_type,
        not_before=content.not_before,
        duration_seconds=content.duration_seconds,
        resources=tuple(vm for vm in _lower_unique(content.resources) if vm in vms),
        description=content.description,
        event_source=content.event_source,
        first_seen=min(e.at for e in entries),
        last_seen=max(e.at for e in entries),
        scheduled_at=scheduled.at if scheduled else None,
        started_at=started.at if started else None,
        ended_at=ended.at if ended else None,
        updates=len({e.key for e in entries if e.name == "Updated"}),
        notice_seconds=notice,
        approved_at=approved.at if approved else None,
        approved_by=_text(approved.details.get("requestedBy")) if approved else "",
        approval_reason=_text(approved.details.get("reason"), MAX_TEXT) if approved else "",
        prepared_at=prepared.at if prepared else None,
        prepared_by=_text(prepared.details.get("preparedBy")) if prepared else "",
        held_at=first_held.at if first_held else None,
        held=last_held is not None and not prepared_since and state == "Scheduled",
        held_pool=_text(last_held.details.get("pool"), MAX_POOL) if last_held else "",
        restored_at=restored.at if restored else None,
        measured_seconds=float(measured)
        if isinstance(measured, int | float) and not isinstance(measured, bool)
        else None,
        measure_method=_text(impact.get("method"), 40),
        sources=tuple(sorted({e.source for e in transitions if e.source}))[:MAX_SOURCES],
        measured_vms=per_vm,
    )


def summarize(entries: Sequence[Entry], complete: bool = True) -> EventSummary | None:
    """One scope's summary of an event from its entries, whatever order they arrived in
    (None: none). Keeps the :data:`MAX_APPEARANCES` appearances most recently recorded (a
    flood of invented appearances from the same scope cannot push out the one in progress
    for longer than until its next entry) and the first :data:`MAX_VMS` VM names."""
    if not entries:
        return None
    groups = _appearances(entries)
    recency = {n: max(e.recorded_at for e in group) for n, group in groups.items()}
    kept = sorted(groups, key=lambda n: (recency[n], n))[-MAX_APPEARANCES:]
    content_vms = {vm for n in kept for vm in _lower_unique(_content(groups[n]).resources)}
    life = ordered(entries)
    latest_transition = next((e for e in reversed(life) if e.is_transition), life[-1])
    vms = tuple(sorted(content_vms))[:MAX_VMS]
    if not vms and latest_transition.observer:
        vms = (_text(latest_transition.observer.lower(), MAX_VM_NAME),)
    chosen = frozenset(vms)
    appearances = tuple(_appearance(n, groups[n], chosen) for n in sorted(kept))
    event_ids = sorted({e.event_id for e in entries if e.event_id})
    return EventSummary(
        event_id=event_ids[0] if event_ids else entries[0].event_id,
        scope=latest_transition.scope,
        scope_key=latest_transition.scope_key,
        resource_group=latest_transition.resource_group,
        subscription_id=latest_transition.subscription_id,
        observer=latest_transition.observer,
        vms=vms,
        appearances=appearances,
        entries=len({e.key for e in entries}),
        complete=complete,
        last_recorded=max(e.recorded_at for e in entries),
    )


def vm_column(vm: str) -> str:
    """The column that names ``vm`` on a summary's rows (a digest: a valid property name,
    whatever the VM is called), so that ``?vm=`` is one filter on an index."""
    return "v" + hashlib.sha256(vm.lower().encode("utf-8", "surrogatepass")).hexdigest()[:24]


def appearance_column(position: int) -> str:
    return f"a{position:02d}"


def summary_properties(summary: EventSummary) -> dict[str, Any]:
    """The summary as the properties of one table row, each string within
    :data:`PROPERTY_UNITS` by construction (nothing kept twice): ``head`` (the event-level
    fields), one ``aNN`` per appearance (two texts of up to 2,000 characters and short
    fields), one ``v<digest>`` column per VM (its name), and the columns listings filter on."""
    latest = summary.latest
    head = {
        "eventId": summary.event_id,
        "scope": summary.scope,
        "scopeKey": summary.scope_key,
        "resourceGroup": summary.resource_group,
        "subscriptionId": summary.subscription_id,
        "observer": summary.observer,
        "entries": summary.entries,
        "complete": summary.complete,
        "lastRecorded": _iso(summary.last_recorded),
        "appearances": len(summary.appearances),
    }
    properties: dict[str, Any] = {
        "eventKey": summary.event_key,
        "state": latest.state,
        "eventType": latest.event_type,
        "resourceGroup": summary.resource_group.lower(),
        "when": clamp_time(latest.when),
        "lastRecorded": clamp_time(summary.last_recorded),
        "head": _json(head),
    }
    for position, appearance in enumerate(summary.appearances):
        properties[appearance_column(position)] = _json(appearance.to_record(summary.vms))
    for vm in summary.vms:
        properties[vm_column(vm)] = vm
    return properties


_VM_COLUMN = re.compile(r"^v[0-9a-f]{24}$")


def summary_from_properties(properties: Mapping[str, Any]) -> EventSummary:
    """:func:`summary_properties` read back; ValueError (or KeyError, TypeError) if not one."""
    head = json.loads(properties["head"])
    if not isinstance(head, dict) or not isinstance(head.get("eventId"), str):
        raise ValueError("not a summary")
    vms = tuple(
        sorted(
            _text(value, MAX_VM_NAME)
            for name, value in properties.items()
            if _VM_COLUMN.match(name) and isinstance(value, str)
        )
    )[:MAX_VMS]
    count = min(_int(head.get("appearances")) or 0, MAX_APPEARANCES)
    appearances = tuple(
        Appearance.from_record(json.loads(properties[appearance_column(i)]), vms)
        for i in range(count)
    )
    last_recorded = _time(head.get("lastRecorded"))
    if not appearances or last_recorded is None:
        raise ValueError("not a summary")
    return EventSummary(
        event_id=_text(head["eventId"]),
        scope=_text(head.get("scope"), MAX_SCOPE),
        scope_key=_text(head.get("scopeKey"), 32),
        resource_group=_text(head.get("resourceGroup")),
        subscription_id=_text(head.get("subscriptionId")),
        observer=_text(head.get("observer")),
        vms=vms,
        appearances=appearances,
        entries=_int(head.get("entries")) or 0,
        complete=head.get("complete") is not False,
        last_recorded=last_recorded,
    )


def summary_line(summary: EventSummary) -> dict[str, Any]:
    """The structured line logged for each summary written (the workbook's data)."""
    latest = summary.latest
    return {
        "eventId": summary.event_key,
        "scope": summary.scope_key,
        "eventType": latest.event_type,
        "state": latest.state,
        "resourceGroup": summary.resource_group.lower(),
        "vmCount": len(summary.vms),
        "notBefore": _iso(latest.not_before),
        "noticeSeconds": latest.notice_seconds,
        "announcedSeconds": latest.announced_seconds,
        "measuredSeconds": latest.measured_seconds,
        "measureMethod": latest.measure_method or None,
        "measuredVms": len(latest.measured_vms),
        "held": latest.held_at is not None,
        "approvedBy": latest.approved_by or None,
        "approvalSeconds": _seconds(latest.approved_at, latest.scheduled_at),
        "updates": latest.updates,
        "sources": ",".join(latest.sources),
    }


# ---- the store and the workflow -------------------------------------------------------------
@dataclass(frozen=True)
class EntryRead:
    """An event scope's entries as the store read them."""

    entries: list[Entry]
    complete: bool = True  # False: the store's bound left rows unread


@dataclass(frozen=True)
class StoredSummary:
    """A summary as stored: None when its row is unreadable (it is written over)."""

    summary: EventSummary | None
    etag: str
    settled: bool = True  # its index rows are known to match it
    marks: tuple[str, ...] = ()  # the store's own bookkeeping (where its index rows are)


@dataclass(frozen=True)
class Listing:
    summaries: list[EventSummary]
    complete: bool = True  # False: the store's bound on one request's work was reached


class HistoryStore(Protocol):
    """Where entries and summaries live (functions.adapters.history_table in the app). Every
    method raises :class:`StoreUnavailable` for a fault that may pass."""

    def add(self, entries: Sequence[Entry]) -> None:
        """Write each entry under its event scope and key, unless that row exists."""

    def entries(self, key: str) -> EntryRead:
        """The event scope's entries (``key``: a summary key), bounded; the lifecycle rows are
        read even when the bulk ones (Prepared, Held, Restored) exceed the bound."""

    def summary(self, key: str) -> StoredSummary | None:
        """The stored summary (None: none yet)."""

    def save_summary(self, summary: EventSummary, stored: StoredSummary | None) -> None:
        """Write over ``stored`` (None: only if there is none) and bring the indexes in line;
        SummaryConflict if it changed meanwhile."""

    def scopes(self, event: str) -> list[str]:
        """The summary keys of the event ``event`` (an event key), bounded."""

    def latest(self, query: EventQuery) -> Listing:
        """The summaries ``query`` asks for, the latest (by ``when``) first, at most
        ``query.limit``."""

    def upcoming(self, start: datetime, end: datetime, limit: int) -> list[EventSummary]:
        """Summaries whose ``when`` is within [start, end], the earliest first, at most
        ``limit``."""

    def expired(self, before: datetime, limit: int) -> list[str]:
        """Summary keys whose last entry was recorded before ``before``, at most ``limit``."""

    def delete(self, key: str) -> None:
        """The event scope's index rows, entries, then its summary."""


class PurgeSchedule:
    """When this process last purged (one per process, kept by the composition root). Two
    invocations that ask at the same moment may both purge: harmless, since deletes are
    idempotent and each run is bounded."""

    def __init__(self) -> None:
        self._last: datetime | None = None

    def due(self, now: datetime, every: timedelta) -> bool:
        if self._last is not None and now - self._last < every:
            return False
        self._last = now
        return True


class PendingEntries:
    """Actions recorded while the store was down for longer than the recorder's window, kept
    in memory (one per process, bounded) and written with this process's next history write.
    A deque: its appends and pops are atomic, so no lock is needed."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self._items: deque[Entry] = deque(maxlen=limit)

    def __len__(self) -> int:
        return len(self._items)

    def add(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if len(self._items) == self._items.maxlen:
                dropped = self._items[0]
                log.error(
                    "history: %s of %s dropped: %d actions already wait for the store",
                    dropped.name,
                    dropped.event_id,
                    len(self._items),
                )
            self._items.append(entry)

    def take(self) -> list[Entry]:
        taken: list[Entry] = []
        while True:
            try:
                taken.append(self._items.popleft())
            except IndexError:
                return taken


@dataclass
class Recorded:
    entries: int = 0
    summary: EventSummary | None = None
    written: bool = False
    purged: int = 0
    replayed: int = 0


@dataclass(frozen=True)
class Timeline:
    summary: EventSummary
    entries: list[Entry]  # in time order


@dataclass(frozen=True)
class History:
    store: HistoryStore
    retention: timedelta
    schedule: PurgeSchedule = field(default_factory=PurgeSchedule)
    purge_every: timedelta = PURGE_EVERY
    purge_batch: int = PURGE_BATCH
    # How long one delivery rides out storage faults before it fails (and is redelivered).
    window: RetryWindow = field(default_factory=RetryWindow)
    pending: PendingEntries = field(default_factory=PendingEntries)

    def record(self, verified: VerifiedMessage, now: datetime) -> Recorded:
        entry = entry_for(verified, now)
        if entry is None:
            return Recorded()
        return self.record_entries([entry], now)

    def record_entries(
        self, entries: Sequence[Entry], now: datetime, window: RetryWindow | None = None
    ) -> Recorded:
        """Write ``entries`` and refresh their summaries, riding out storage faults for
        ``window`` (the history's own by default), then raise. Then the actions waiting in
        :attr:`pending` (one try) and the retention run when it is due."""
        outcome = within(window or self.window, lambda: self._write(entries), "history write")
        outcome.replayed = self._replay()
        outcome.purged = self.purge(now)
        return outcome

    def _write(self, entries: Sequence[Entry]) -> Recorded:
        self.store.add(entries)
        outcome = Recorded(entries=len(entries))
        for key in sorted({e.summary_key for e in entries}):
            summary, written = self.refresh(key)
            outcome.summary = summary
            outcome.written = outcome.written or written
        return outcome

    def _replay(self) -> int:
        waiting = self.pending.take()
        if not waiting:
            return 0
        try:
            self._write(waiting)
        except TransientFault as exc:
            self.pending.add(waiting)
            log.warning("history: %d waiting actions not written yet: %s", len(waiting), exc)
            return 0
        except Exception as exc:  # noqa: BLE001 - never fails the message being recorded
            log.error("history: %d waiting actions dropped: %s", len(waiting), exc)
            return 0
        log.info("history: %d waiting actions written", len(waiting))
        return len(waiting)

    def refresh(self, key: str) -> tuple[EventSummary | None, bool]:
        """Derive the event scope's summary from its entries and write it if it changed (or
        its indexes may lag it): the stored summary (and its ETag) is read *before* the
        entries, so a write that succeeds saw every entry added before the summary it replaces
        was written."""
        for _ in range(MAX_SUMMARY_ATTEMPTS):
            stored = self.store.summary(key)
            read = self.store.entries(key)
            summary = summarize(read.entries, read.complete)
            if summary is None:
                return None, False
            same = stored is not None and stored.summary == summary
            if same and stored is not None and stored.settled:
                return summary, False
            try:
                self.store.save_summary(summary, stored)
            except SummaryConflict:
                log.info("summary of %s changed meanwhile, reading again", key)
                continue
            if not same:
                line = _json(summary_line(summary))
                summary_log.info("%s%s", SUMMARY_PREFIX, line)
            return summary, not same
        raise SummaryConflict(f"the summary of {key} kept changing")

    def purge(self, now: datetime) -> int:
        """Delete up to ``purge_batch`` event scopes whose last entry was recorded before
        ``now`` minus the retention, at most once per ``purge_every`` in this process. A
        failure is logged; the next run tries again."""
        if not self.schedule.due(now, self.purge_every):
            return 0
        try:
            keys = self.store.expired(clamp_time(now - self.retention), self.purge_batch)
            for key in keys:
                self.store.delete(key)
        except Exception as exc:  # noqa: BLE001 - purging must never fail a message
            log.warning("history retention: purge failed (%s), tried again later", exc)
            return 0
        if keys:
            log.info("history retention: %d events past %s deleted", len(keys), self.retention)
        return len(keys)

    def timeline(self, event: str) -> list[Timeline]:
        """Every scope's entry of the event ``event`` (an event key): its summary and entries."""
        found: list[Timeline] = []
        for key in self.store.scopes(event):
            read = self.store.entries(key)
            summary = summarize(read.entries, read.complete)
            if summary is not None:
                found.append(Timeline(summary, ordered(read.entries)))
        found.sort(key=lambda t: (t.summary.last_seen, t.summary.key), reverse=True)
        return found


RECORDER_WINDOW = RetryWindow(seconds=20.0)


class StoreRecorder:
    """An :class:`~functions.shared.ports.ActionRecorder` onto the history (the composition
    root hands it to lb-pools). Storage faults are retried for :data:`RECORDER_WINDOW` (the
    workflow waits that long at most); what still could not be written waits in the history's
    :class:`PendingEntries` for this process's next history write. Recording never fails the
    workflow."""

    def __init__(self, history: History, source: str, window: RetryWindow | None = None) -> None:
        self._history = history
        self._source = source
        self._window = window or replace(
            RECORDER_WINDOW, sleep=history.window.sleep, monotonic=history.window.monotonic
        )

    def record(
        self, verified: VerifiedMessage, action: str, at: datetime, details: Mapping[str, Any]
    ) -> None:
        try:
            entry = action_entry(verified, action, at, self._source, details)
        except Exception as exc:  # noqa: BLE001 - the history never fails the workflow
            log.error("history: %s of %s not recorded: %s", action, verified.message.event_id, exc)
            return
        if entry is None:
            return
        try:
            self._history.record_entries([entry], at, window=self._window)
        except TransientFault as exc:
            self._history.pending.add([entry])
            log.error(
                "history: %s of %s not recorded yet (%s): kept for this instance's next "
                "history write",
                action,
                entry.event_id,
                exc,
            )
        except Exception as exc:  # noqa: BLE001 - the history never fails the workflow
            log.error("history: %s of %s not recorded: %s", action, entry.event_id, exc)


# ---- queries ------------------------------------------------------------------------------
DEFAULT_LIMIT = 100
MAX_LIMIT = 500
# Summaries of the index one listing or calendar reads at most, for its fair share by scope
# (:func:`fair_share`): a scope that floods more than this many events into the range read can
# still push another scope's out.
MAX_SCAN = 2000


class QueryError(ValueError):
    """A filter that is not valid (the endpoint answers 400 with this text)."""


@dataclass(frozen=True)
class EventQuery:
    state: str | None = None
    vm: str | None = None
    resource_group: str | None = None
    start: datetime | None = None  # ``from``: NotBefore (or start, or first seen) at or after
    end: datetime | None = None  # ``to``: ... at or before
    limit: int = DEFAULT_LIMIT


_ISO_DATE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[T ][0-9:.,]+(?:[Zz]|[+-][0-9:]+)?)?$")


def parse_bound(raw: str) -> datetime:
    """A ``from``/``to`` bound: ISO 8601 with a four-digit year (``2026-11-26``,
    ``2026-11-26T07:00:00Z``, ``...+01:00``), UTC when no offset is given (never the
    process's time zone), held to 1601..9999. QueryError for anything else."""
    text = raw.strip()
    if len(text) > 64 or not _ISO_DATE.match(text):
        raise ValueError("not ISO 8601")
    parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    return clamp_time(parsed)


def parse_query(params: Mapping[str, str]) -> EventQuery:
    """The filters of ``GET /api/events``: state, vm, resourceGroup, from, to, limit."""
    unknown = sorted(set(params) - {"state", "vm", "resourceGroup", "from", "to", "limit", "code"})
    if unknown:
        raise QueryError(f"unknown filter {unknown[0][:40]!r}")
    state = params.get("state") or None
    if state is not None:
        matched = [s for s in STATES if s.lower() == state.lower()]
        if not matched:
            raise QueryError(f"state must be one of {', '.join(STATES)}")
        state = matched[0]
    vm = params.get("vm") or None
    # A VM (or scale-set instance), or the availability set or scale set Event Grid names.
    if vm is not None and not (names.VIRTUAL_MACHINE.valid(vm) or names.AVAILABILITY_SET.valid(vm)):
        raise QueryError("vm is not a VM name")
    group = params.get("resourceGroup") or None
    if group is not None and not names.RESOURCE_GROUP.valid(group):
        raise QueryError("resourceGroup is not a resource group name")
    bounds: list[datetime | None] = []
    for name in ("from", "to"):
        raw = params.get(name)
        if not raw:
            bounds.append(None)
            continue
        try:
            bounds.append(parse_bound(raw))
        except ValueError:
            raise QueryError(
                f"{name} is not an ISO 8601 time (e.g. 2026-11-26T00:00:00Z)"
            ) from None
    limit = DEFAULT_LIMIT
    if params.get("limit"):
        try:
            limit = int(params["limit"])
        except ValueError:
            raise QueryError("limit is not an integer") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise QueryError(f"limit must be 1..{MAX_LIMIT}")
    return EventQuery(state, vm, group, bounds[0], bounds[1], limit)


def matches(summary: EventSummary, query: EventQuery) -> bool:
    latest = summary.latest
    if query.state is not None and latest.state != query.state:
        return False
    if query.vm is not None and query.vm.lower() not in summary.vms:
        return False
    if (
        query.resource_group is not None
        and query.resource_group.lower() != summary.resource_group.lower()
    ):
        return False
    when = clamp_time(latest.when)
    if query.start is not None and when < query.start:
        return False
    return not (query.end is not None and when > query.end)


def latest_first(summary: EventSummary) -> tuple[int, str]:
    """The listing's order: the latest ``when`` first, then by key (as the index sorts)."""
    return -time_rank(summary.latest.when), summary.key


def select(summaries: Iterable[EventSummary], query: EventQuery) -> list[EventSummary]:
    """What ``query`` asks for, the latest first, at most ``query.limit``."""
    found = [s for s in summaries if matches(s, query)]
    found.sort(key=latest_first)
    return found[: query.limit]


def fair_share(summaries: Iterable[EventSummary], limit: int) -> list[EventSummary]:
    """At most ``limit`` of ``summaries`` (in the index's order), shared out equally among
    their scopes: every scope's first, then every scope's second, and so on, what one scope
    leaves unused going to the others; kept in the given order. A verified VM can invent
    events only in its own scope, so a flood from one scope fills that scope's share and
    never pushes another scope's next maintenance out (hostile review 23c, item 3)."""
    rank: dict[str, int] = {}
    placed: list[tuple[int, int, EventSummary]] = []
    for position, summary in enumerate(summaries):
        turn = rank.get(summary.scope_key, 0)
        rank[summary.scope_key] = turn + 1
        placed.append((turn, position, summary))
    chosen = sorted(placed, key=lambda item: (item[0], item[1]))[: max(limit, 0)]
    return [summary for _, _, summary in sorted(chosen, key=lambda item: item[1])]


def impact_by_type(summaries: Iterable[EventSummary]) -> dict[str, dict[str, Any]]:
    """Announced against measured impact per event type (over the given events)."""
    by_type: dict[str, dict[str, Any]] = {}
    for summary in summaries:
        latest = summary.latest
        row = by_type.setdefault(
            latest.event_type or "unknown",
            {"events": 0, "announced": [], "measured": [], "completed": 0},
        )
        row["events"] += 1
        row["completed"] += latest.state == "Completed"
        if latest.announced_seconds is not None:
            row["announced"].append(latest.announced_seconds)
        if latest.measured_vms:  # every VM's figure, not one per event
            row["measured"].extend(m.seconds for m in latest.measured_vms)
        elif latest.measured_seconds is not None:
            row["measured"].append(latest.measured_seconds)
    result: dict[str, dict[str, Any]] = {}
    for event_type, row in sorted(by_type.items()):
        announced, measured = row["announced"], row["measured"]
        result[event_type] = {
            "events": row["events"],
            "completed": row["completed"],
            "measured": len(measured),
            "announcedSecondsAvg": round(sum(announced) / len(announced), 1) if announced else None,
            "measuredSecondsAvg": round(sum(measured) / len(measured), 3) if measured else None,
            "measuredSecondsMax": max(measured) if measured else None,
        }
    return result


def timeline_json(timeline: Timeline) -> dict[str, Any]:
    """One scope's entry of ``GET /api/events/{eventId}``: its summary and every entry read,
    in time order."""
    rows = []
    for entry in timeline.entries:
        row: dict[str, Any] = {
            "at": _iso(entry.at),
            "recorded": _iso(entry.recorded),
            "kind": "transition"
            if entry.is_transition
            else ("report" if entry.name in REPORTS else "action"),
            "name": entry.name,
            "source": entry.source,
            "observer": entry.observer,
        }
        if entry.name in ("Scheduled", "Updated"):
            row["notBefore"] = _iso(entry.not_before)
            row["durationInSeconds"] = entry.duration_seconds
            row["resources"] = list(entry.resources)
        if entry.details:
            row["details"] = dict(entry.details)
        rows.append(row)
    summary = timeline.summary
    return {
        "scope": summary.scope,
        "id": summary.key,
        "complete": summary.complete,
        "event": summary.to_json(),
        "timeline": rows,
    }
