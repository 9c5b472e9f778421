"""history: every event's timeline, kept after the cards are posted (core).

Each message on the ``history`` subscription (every transition but Heartbeat) becomes one
:class:`Entry` of its event: a lifecycle transition (Scheduled, Updated, Started, Completed,
Cancelled, by the forwarder or Event Grid) or an action (Prepared by lb-pools, hooks or the drain
probe; Held by lb-pools; Approved, by whom and why); what reaches no topic (lb-pools putting VMs
back) is recorded through ``functions.shared.ports.ActionRecorder``. An entry's key derives
from the message id, so a redelivery writes the same row again and changes nothing.

Per event a summary (:class:`EventSummary`) is derived from the *set* of its entries, never
from the order they arrived in: the state is the furthest transition seen (Completed or
Cancelled over Started over Scheduled), the content (NotBefore, duration, VMs) that of the
Scheduled or Updated observed last, each time the earliest observation of it. A late or
redelivered message therefore yields the same summary as one that came in order. The summary
is written under its ETag after the entries were read (:meth:`History.refresh`): a writer that
lost the race reads again, so the last summary written always saw every entry written before
it.

Retention: events whose last entry is older than ``HISTORY_RETENTION_DAYS`` are deleted, at
most :data:`PURGE_BATCH` events per run and one run per :data:`PURGE_EVERY` per process, by the
writes themselves (no timer).

Nothing secret is stored: the fields kept are picked one by one (no seal, no token, no URL);
Description is stored as text, cut to :data:`MAX_TEXT` characters.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from functions.shared import names
from sebridge import lifecycle
from sebridge.contract.events import Transition, TransitionMessage
from sebridge.imds import isoformat_utc, parse_not_before

log = logging.getLogger("sebridge.functions.history")

SUMMARY_PREFIX = "sebridge.history "
SUMMARY_LOGGER = "sebridge.functions.history.summary"
summary_log = logging.getLogger(SUMMARY_LOGGER)

MAX_TEXT = 2000  # Description and reasons, characters
MAX_NAME = 128
MAX_VMS = 200  # VM names kept per entry (an availability set's events name its VMs)
MAX_APPEARANCES = 20  # per event, the latest
MAX_ENTRIES = 500  # read per event
MAX_SUMMARY_ATTEMPTS = 5
PURGE_EVERY = timedelta(minutes=10)
PURGE_BATCH = 20

TRANSITIONS = ("Scheduled", "Updated", "Started", "Completed", "Cancelled")
ACTIONS = ("Prepared", "Held", "Approved", "Restored")
STATES = ("Scheduled", "Started", "Completed", "Cancelled")
_APPEARANCE = re.compile(r"^[^:]+:(?:Scheduled|Updated|Started|Completed|Cancelled|Approved):(\d+)")


class SummaryConflict(Exception):
    """Someone else wrote the event's summary since it was read (read again and retry)."""


def event_key(event_id: str) -> str:
    """The event's key in the store: the lower-case EventId (a GUID), or a digest of anything
    else (:func:`sebridge.lifecycle.event_ref`, as in message ids), so that no character from a
    message reaches a key or a URL."""
    return lifecycle.event_ref(event_id)


def _text(value: object, limit: int = MAX_NAME) -> str:
    if not isinstance(value, str):
        return ""
    clean = "".join(ch for ch in value if ch >= " " or ch in "\n\t")
    clean = clean.encode("utf-8", "replace").decode("utf-8")
    return clean if len(clean) <= limit else clean[: limit - 1] + "\u2026"


def _time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)
        except ValueError:
            return parse_not_before(value)
    return None


def _iso(value: datetime | None) -> str | None:
    return isoformat_utc(value) if value is not None else None


def _seconds(later: datetime | None, earlier: datetime | None) -> int | None:
    if later is None or earlier is None:
        return None
    return int((later - earlier).total_seconds())


@dataclass(frozen=True)
class Entry:
    """One transition or action of one event, as stored (one row)."""

    event_id: str  # the EventId as the message carried it
    key: str  # stable per message: a redelivery has the same key
    name: str  # a transition (TRANSITIONS) or an action (ACTIONS)
    at: datetime  # when it was observed or done (the message's time)
    source: str  # forwarder, event-grid, lb-pools, hooks, drain-probe...
    appearance: int = 0  # 0: unknown (actions): the appearance current at ``at``
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

    def to_record(self) -> dict[str, Any]:
        return {
            "eventId": self.event_id,
            "key": self.key,
            "name": self.name,
            "at": _iso(self.at),
            "source": self.source,
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
        if at is None or name not in (*TRANSITIONS, *ACTIONS):
            raise ValueError("not a history entry")
        duration = record.get("durationInSeconds")
        appearance = record.get("appearance")
        resources = record.get("resources")
        details = record.get("details")
        return cls(
            event_id=_text(record.get("eventId")),
            key=_text(record.get("key")),
            name=str(name),
            at=at,
            source=_text(record.get("source")),
            appearance=appearance if isinstance(appearance, int) and appearance >= 0 else 0,
            event_type=_text(record.get("eventType")),
            status=_text(record.get("status")),
            not_before=_time(record.get("notBefore")),
            duration_seconds=duration
            if isinstance(duration, int) and not isinstance(duration, bool)
            else None,
            resources=tuple(_text(r) for r in resources if isinstance(r, str))[:MAX_VMS]
            if isinstance(resources, list)
            else (),
            description=_text(record.get("description"), MAX_TEXT),
            event_source=_text(record.get("eventSource")),
            observer=_text(record.get("observer")),
            resource_group=_text(record.get("resourceGroup")),
            subscription_id=_text(record.get("subscriptionId")),
            details=dict(details) if isinstance(details, dict) else {},
        )


# ---- messages to entries ------------------------------------------------------------------
def entry_key(name: str, cause: str) -> str:
    """The row key of ``name`` caused by message ``cause``: the same message, the same row."""
    digest = hashlib.sha256(cause.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{name.lower()}-{digest}"


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
    """``data.impact`` of a Completed (optional), as the contract's reader reads it."""
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
        vms = prepared.get("vms")
        return {
            "preparedBy": _text(prepared.get("preparedBy")),
            "vms": [_text(v) for v in vms if isinstance(v, str)][:MAX_VMS]
            if isinstance(vms, list)
            else [],
        }
    if transition is Transition.HELD:
        held = data.get("held")
        held = held if isinstance(held, dict) else {}
        vms = held.get("vms")
        return {
            "pool": _text(held.get("pool"), 400),
            "healthy": held.get("healthy") if isinstance(held.get("healthy"), int) else None,
            "minimum": held.get("minimum") if isinstance(held.get("minimum"), int) else None,
            "vms": [_text(v) for v in vms if isinstance(v, str)][:MAX_VMS]
            if isinstance(vms, list)
            else [],
        }
    if transition is Transition.UPDATED:
        changes = data.get("changes")
        return {"changed": sorted(_text(k) for k in changes)} if isinstance(changes, dict) else {}
    if transition is Transition.COMPLETED:
        impact = measured_impact(message)
        return {"impact": impact} if impact else {}
    return {}


def entry_for(message: TransitionMessage) -> Entry | None:
    """The entry a topic message makes (None: Heartbeat, which is no event's)."""
    event = message.event
    if event is None or message.transition is Transition.HEARTBEAT:
        return None
    cause = message.message_id or f"{event.key}:{message.transition.value}"
    appearance = 0
    found = _APPEARANCE.match(cause)
    if found and message.transition.value in (*TRANSITIONS, "Approved"):
        appearance = min(int(found.group(1)), 1_000_000)
    duration = event.duration_in_seconds
    return Entry(
        event_id=_text(event.event_id),
        key=entry_key(message.transition.value, cause),
        name=message.transition.value,
        at=(message.time or datetime.now(UTC)).astimezone(UTC),
        source=_source(message),
        appearance=appearance,
        event_type=_text(event.event_type),
        status=_text(event.status),
        not_before=event.not_before,
        duration_seconds=duration if duration is not None and abs(duration) < 2**31 else None,
        resources=tuple(_text(r) for r in event.resources)[:MAX_VMS],
        description=_text(event.description, MAX_TEXT),
        event_source=_text(event.event_source),
        observer=_text(message.observer.vm_name),
        resource_group=_text(message.observer.resource_group),
        subscription_id=_text(message.observer.subscription_id),
        details=_details(message),
    )


def action_entry(
    message: TransitionMessage, name: str, at: datetime, source: str, details: Mapping[str, Any]
) -> Entry | None:
    """An action a workflow reports through an ``ActionRecorder`` (``Restored``), keyed by the
    message that caused it."""
    base = entry_for(message)
    if base is None or name not in ACTIONS:
        return None
    cause = message.message_id or base.key
    return replace(
        base,
        key=entry_key(name, cause),
        name=name,
        at=at.astimezone(UTC),
        source=source,
        appearance=0,
        details=dict(details),
    )


# ---- entries to a summary -----------------------------------------------------------------
@dataclass(frozen=True)
class Appearance:
    """One appearance of an event (it comes back after it ended: Scheduled again)."""

    number: int
    state: str
    event_type: str
    not_before: datetime | None
    duration_seconds: int | None
    resources: tuple[str, ...]
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
    measured_seconds: float | None = None
    measure_method: str = ""
    sources: tuple[str, ...] = ()

    @property
    def announced_seconds(self) -> int | None:
        d = self.duration_seconds
        return d if d is not None and d >= 0 else None

    @property
    def when(self) -> datetime:
        """When it is (or was) to happen: NotBefore, else when it started, else first seen."""
        return self.not_before or self.started_at or self.first_seen

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
            },
            "sources": list(self.sources),
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Appearance:
        impact = obj.get("impact") if isinstance(obj.get("impact"), dict) else {}
        assert isinstance(impact, dict)
        first_seen = _time(obj.get("firstSeen"))
        if first_seen is None or obj.get("state") not in STATES:
            raise ValueError("not an appearance")
        measured = impact.get("measuredSeconds")
        number = obj.get("appearance")
        updates = obj.get("updates")
        notice = obj.get("noticeSeconds")
        duration = obj.get("durationInSeconds")
        return cls(
            number=number if isinstance(number, int) else 1,
            state=str(obj["state"]),
            event_type=_text(obj.get("eventType")),
            not_before=_time(obj.get("notBefore")),
            duration_seconds=duration if isinstance(duration, int) else None,
            resources=tuple(_text(r) for r in obj.get("resources") or [] if isinstance(r, str)),
            description=_text(obj.get("description"), MAX_TEXT),
            event_source=_text(obj.get("eventSource")),
            first_seen=first_seen,
            last_seen=_time(obj.get("lastSeen")) or first_seen,
            scheduled_at=_time(obj.get("scheduledAt")),
            started_at=_time(obj.get("startedAt")),
            ended_at=_time(obj.get("endedAt")),
            updates=updates if isinstance(updates, int) else 0,
            notice_seconds=notice if isinstance(notice, int) else None,
            approved_at=_time(obj.get("approvedAt")),
            approved_by=_text(obj.get("approvedBy")),
            approval_reason=_text(obj.get("approvalReason"), MAX_TEXT),
            prepared_at=_time(obj.get("preparedAt")),
            prepared_by=_text(obj.get("preparedBy")),
            held_at=_time(obj.get("heldAt")),
            held=obj.get("held") is True,
            held_pool=_text(obj.get("heldPool"), 400),
            restored_at=_time(obj.get("restoredAt")),
            measured_seconds=float(measured) if isinstance(measured, int | float) else None,
            measure_method=_text(impact.get("method"), 40),
            sources=tuple(_text(s) for s in obj.get("sources") or [] if isinstance(s, str)),
        )


@dataclass(frozen=True)
class EventSummary:
    """An event as its entries tell it: the latest appearance first, the others after."""

    event_id: str
    resource_group: str
    subscription_id: str
    observer: str
    appearances: tuple[Appearance, ...]  # oldest first; never empty
    entries: int

    @property
    def latest(self) -> Appearance:
        return self.appearances[-1]

    @property
    def key(self) -> str:
        return event_key(self.event_id)

    @property
    def last_seen(self) -> datetime:
        return max(a.last_seen for a in self.appearances)

    @property
    def vms(self) -> tuple[str, ...]:
        names = {r.lower() for a in self.appearances for r in a.resources}
        return tuple(sorted(names or ({self.observer.lower()} if self.observer else set())))

    def to_json(self) -> dict[str, Any]:
        latest = self.latest.to_json()
        return {
            "eventId": self.event_id,
            **{k: v for k, v in latest.items() if k != "appearance"},
            "appearance": self.latest.number,
            "resourceGroup": self.resource_group,
            "subscriptionId": self.subscription_id,
            "observer": self.observer,
            "vms": list(self.vms),
            "entries": self.entries,
            "appearances": [a.to_json() for a in self.appearances],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EventSummary:
        """Raises ValueError (or KeyError, TypeError) for what is not a stored summary."""
        appearances = tuple(Appearance.from_json(a) for a in obj["appearances"])
        if not appearances or not isinstance(obj.get("eventId"), str):
            raise ValueError("not a summary")
        entries = obj.get("entries")
        return cls(
            event_id=_text(obj["eventId"]),
            resource_group=_text(obj.get("resourceGroup")),
            subscription_id=_text(obj.get("subscriptionId")),
            observer=_text(obj.get("observer")),
            appearances=appearances,
            entries=entries if isinstance(entries, int) else 0,
        )


_ORDER = {name: i for i, name in enumerate((*TRANSITIONS, *ACTIONS))}


def _sort_key(entry: Entry) -> tuple[datetime, int, str]:
    return entry.at, _ORDER.get(entry.name, 99), entry.key


def ordered(entries: Iterable[Entry]) -> list[Entry]:
    """Entries by time (then lifecycle order, then key): the timeline as it happened."""
    return sorted(entries, key=_sort_key)


def _appearances(entries: Sequence[Entry]) -> dict[int, list[Entry]]:
    """Entries by appearance: a transition's from its message id, an action's is the latest
    appearance that began at or before it (so an action counts where it happened)."""
    known = [e for e in entries if e.appearance > 0]
    starts: dict[int, datetime] = {}
    for e in known:
        starts[e.appearance] = min(starts.get(e.appearance, e.at), e.at)
    groups: dict[int, list[Entry]] = {}
    for e in entries:
        number = e.appearance
        if number == 0:
            before = [n for n, at in starts.items() if at <= e.at]
            number = max(before) if before else (min(starts) if starts else 1)
        groups.setdefault(number, []).append(e)
    return groups


def _earliest(entries: Iterable[Entry], *names: str) -> Entry | None:
    found = [e for e in entries if e.name in names]
    return min(found, key=_sort_key) if found else None


def _appearance(number: int, entries: Sequence[Entry]) -> Appearance:
    names = {e.name for e in entries}
    if "Completed" in names:
        state = "Completed"
    elif "Cancelled" in names:
        state = "Cancelled"
    elif "Started" in names:
        state = "Started"
    else:
        state = "Scheduled"
    transitions = [e for e in entries if e.is_transition]
    content_from = [e for e in transitions if e.name in ("Scheduled", "Updated")] or (
        transitions or list(entries)
    )
    content = max(content_from, key=_sort_key)
    scheduled = _earliest(entries, "Scheduled")
    started = _earliest(entries, "Started")
    ended = _earliest(entries, "Completed", "Cancelled")
    approved = _earliest(entries, "Approved")
    prepared = _earliest(entries, "Prepared")
    held_entries = [e for e in entries if e.name == "Held"]
    last_held = max(held_entries, key=_sort_key) if held_entries else None
    prepared_since = last_held is not None and any(
        e.name == "Prepared" and e.at >= last_held.at for e in entries
    )
    restored = _earliest(entries, "Restored")
    first_held = _earliest(entries, "Held")
    completed = _earliest(entries, "Completed")
    impact = completed.details.get("impact") if completed is not None else None
    impact = impact if isinstance(impact, dict) else {}
    measured = impact.get("measuredSeconds")
    notice = None
    if scheduled is not None and scheduled.not_before is not None:
        notice = _seconds(scheduled.not_before, scheduled.at)
    first = min(entries, key=_sort_key)
    return Appearance(
        number=number,
        state=state,
        event_type=content.event_type,
        not_before=content.not_before,
        duration_seconds=content.duration_seconds,
        resources=content.resources,
        description=content.description,
        event_source=content.event_source,
        first_seen=first.at,
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
        held_pool=_text(last_held.details.get("pool"), 400) if last_held else "",
        restored_at=restored.at if restored else None,
        measured_seconds=float(measured) if isinstance(measured, int | float) else None,
        measure_method=_text(impact.get("method"), 40),
        sources=tuple(sorted({e.source for e in transitions if e.source})),
    )


def summarize(entries: Sequence[Entry]) -> EventSummary | None:
    """The event's summary from its entries, whatever order they arrived in (None: none)."""
    if not entries:
        return None
    groups = _appearances(entries)
    numbers = sorted(groups)[-MAX_APPEARANCES:]
    appearances = tuple(_appearance(n, groups[n]) for n in numbers)
    latest_transition = max(
        (e for e in entries if e.is_transition), key=_sort_key, default=max(entries, key=_sort_key)
    )
    event_ids = sorted({e.event_id for e in entries if e.event_id})
    return EventSummary(
        event_id=event_ids[0] if event_ids else entries[0].event_id,
        resource_group=latest_transition.resource_group,
        subscription_id=latest_transition.subscription_id,
        observer=latest_transition.observer,
        appearances=appearances,
        entries=len({e.key for e in entries}),
    )


def summary_line(summary: EventSummary) -> dict[str, Any]:
    """The structured line logged for each summary written (the workbook's data)."""
    latest = summary.latest
    return {
        "eventId": summary.key,
        "eventType": latest.event_type,
        "state": latest.state,
        "resourceGroup": summary.resource_group.lower(),
        "vmCount": len(summary.vms),
        "notBefore": _iso(latest.not_before),
        "noticeSeconds": latest.notice_seconds,
        "announcedSeconds": latest.announced_seconds,
        "measuredSeconds": latest.measured_seconds,
        "measureMethod": latest.measure_method or None,
        "held": latest.held_at is not None,
        "approvedBy": latest.approved_by or None,
        "approvalSeconds": _seconds(latest.approved_at, latest.scheduled_at),
        "updates": latest.updates,
        "sources": ",".join(latest.sources),
    }


# ---- the store and the workflow -------------------------------------------------------------
class HistoryStore(Protocol):
    """Where entries and summaries live (functions.adapters.history_table in the app)."""

    def add(self, entries: Sequence[Entry]) -> None:
        """Write each entry under its event and key (the same key: the same row)."""

    def entries(self, event_key: str) -> list[Entry]:
        """The event's entries (at most MAX_ENTRIES)."""

    def summary(self, event_key: str) -> tuple[EventSummary | None, str | None]:
        """The stored summary and its ETag (None, None: none yet)."""

    def save_summary(self, summary: EventSummary, etag: str | None) -> None:
        """Write under ``etag`` (None: only if there is none); SummaryConflict if it changed."""

    def summaries(self, query: EventQuery) -> list[EventSummary]:
        """Stored summaries that may match ``query`` (the core filters again), bounded."""

    def expired(self, before: datetime, limit: int) -> list[str]:
        """Keys of events whose last entry is older than ``before``, at most ``limit``."""

    def delete(self, event_key: str) -> None:
        """The event's entries, then its summary."""


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


@dataclass
class Recorded:
    entries: int = 0
    summary: EventSummary | None = None
    written: bool = False
    purged: int = 0


@dataclass(frozen=True)
class History:
    store: HistoryStore
    retention: timedelta
    schedule: PurgeSchedule = field(default_factory=PurgeSchedule)
    purge_every: timedelta = PURGE_EVERY
    purge_batch: int = PURGE_BATCH

    def record(self, message: TransitionMessage, now: datetime) -> Recorded:
        entry = entry_for(message)
        if entry is None:
            return Recorded()
        return self.record_entries([entry], now)

    def record_entries(self, entries: Sequence[Entry], now: datetime) -> Recorded:
        self.store.add(entries)
        outcome = Recorded(entries=len(entries))
        for key in sorted({event_key(e.event_id) for e in entries}):
            outcome.summary, outcome.written = self.refresh(key)
        outcome.purged = self.purge(now)
        return outcome

    def refresh(self, key: str) -> tuple[EventSummary | None, bool]:
        """Derive the event's summary from its entries and write it if it changed: the stored
        summary (and its ETag) is read *before* the entries, so a write that succeeds saw every
        entry added before the summary it replaces was written."""
        for _ in range(MAX_SUMMARY_ATTEMPTS):
            stored, etag = self.store.summary(key)
            summary = summarize(self.store.entries(key))
            if summary is None or summary == stored:
                return summary, False
            try:
                self.store.save_summary(summary, etag)
            except SummaryConflict:
                log.info("summary of %s changed meanwhile, reading again", key)
                continue
            line = json.dumps(summary_line(summary), sort_keys=True, separators=(",", ":"))
            summary_log.info("%s%s", SUMMARY_PREFIX, line)
            return summary, True
        raise SummaryConflict(f"the summary of {key} kept changing")

    def purge(self, now: datetime) -> int:
        """Delete up to ``purge_batch`` events past retention, at most once per
        ``purge_every`` in this process. A failure is logged; the next run tries again."""
        if not self.schedule.due(now, self.purge_every):
            return 0
        try:
            keys = self.store.expired(now - self.retention, self.purge_batch)
            for key in keys:
                self.store.delete(key)
        except Exception as exc:  # noqa: BLE001 - purging must never fail a message
            log.warning("history retention: purge failed (%s), tried again later", exc)
            return 0
        if keys:
            log.info("history retention: %d events past %s deleted", len(keys), self.retention)
        return len(keys)

    def timeline(self, key: str) -> tuple[EventSummary, list[Entry]] | None:
        entries = self.store.entries(key)
        summary = summarize(entries)
        return None if summary is None else (summary, ordered(entries))


class StoreRecorder:
    """An :class:`~functions.shared.ports.ActionRecorder` onto the history (the composition
    root hands it to lb-pools)."""

    def __init__(self, history: History, source: str) -> None:
        self._history = history
        self._source = source

    def record(
        self, message: TransitionMessage, action: str, at: datetime, details: Mapping[str, Any]
    ) -> None:
        try:
            entry = action_entry(message, action, at, self._source, details)
            if entry is not None:
                self._history.record_entries([entry], at)
        except Exception as exc:  # noqa: BLE001 - the history never fails the workflow
            log.warning("history: %s of %s not recorded: %s", action, message.event_id, exc)


# ---- queries ------------------------------------------------------------------------------
DEFAULT_LIMIT = 100
MAX_LIMIT = 500


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
        moment = _time(raw) if raw else None
        if raw and moment is None:
            raise QueryError(f"{name} is not an ISO 8601 time (e.g. 2026-11-26T00:00:00Z)")
        bounds.append(moment)
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
    if query.start is not None and latest.when < query.start:
        return False
    return not (query.end is not None and latest.when > query.end)


def select(summaries: Iterable[EventSummary], query: EventQuery) -> list[EventSummary]:
    """What ``query`` asks for, the latest first, at most ``query.limit``."""
    found = [s for s in summaries if matches(s, query)]
    found.sort(key=lambda s: (s.latest.when, s.key), reverse=True)
    return found[: query.limit]


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
        if latest.measured_seconds is not None:
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


def timeline_json(summary: EventSummary, entries: Sequence[Entry]) -> dict[str, Any]:
    """``GET /api/events/{eventId}``: the summary and every entry, in time order."""
    rows = []
    for entry in entries:
        row: dict[str, Any] = {
            "at": _iso(entry.at),
            "kind": "transition" if entry.is_transition else "action",
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
    return {"event": summary.to_json(), "timeline": rows}
