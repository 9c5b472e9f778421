"""eventgrid-ingest: Event Grid notifications -> contract v1 transitions on the topic (core).

Each notification is one state of one scheduled event. The ingestion derives the same
transitions the forwarder derives from IMDS documents, with the same ids
(:func:`sebridge.lifecycle.advance`), so the topic's duplicate detection keeps one copy of a
transition seen both ways. What it remembers of each EventId (the :class:`EventRecord`: the
``Life`` for the ids, the last accepted status, content and time) lives in the app's storage
account, one blob per event, never in process memory: notifications of one event may arrive at
different instances.

Rules, for a notification with status ``s`` and time ``t`` (``operationalInfo.resourceEventTime``
when present, else the Event Grid event time; both are set once by the publisher, so a
redelivery carries the original time) against the record of its EventId:

1. No record: Scheduled -> Scheduled, Started -> Started, Completed -> Completed,
   Canceled -> Cancelled (a first sight may be any state: the app may have started mid-event).
2. The record's appearance has ended (Completed or Cancelled was published):
   - Completed or Canceled again: a duplicate, nothing.
   - Scheduled or Started no newer than the end (``t <= end``, or either time unknown): stale,
     nothing. A late Started, or a late copy of the first Scheduled, never reopens the event.
   - Scheduled or Started strictly newer than the end: the EventId came back, the next
     appearance opens (Scheduled/Started with appearance + 1, as the forwarder reports an
     EventId that reappears in IMDS).
3. The appearance is open:
   - older than the last accepted notification (``t < last``): stale, nothing;
   - Completed / Canceled: the end (Completed / Cancelled);
   - a status before the last one (Scheduled after Started): stale, nothing;
   - Started after Started: nothing (IMDS announces nothing new either);
   - Started after Scheduled: Started;
   - Scheduled after Scheduled: Updated when a watched field changed and ``t`` is newer than
     the last one, else a duplicate (same content) or stale (same time, other content: no
     order to trust).
   Where a time is unknown, only the status order applies.

Publishing and the record: a decision is written first, with the envelopes it produces kept in
the record as ``pending``, under the blob's ETag (If-Match; If-None-Match for a new one). A
write that loses the race re-reads and decides again, so two instances handling notifications
of one event concurrently never both publish transitions from the same old state. After the
write the pending envelopes are published and the record is written once more without them. A
crash in between leaves them pending: the next delivery of any notification of that event (Event
Grid redelivers the failed one) publishes them again under the same message ids, which the
topic's duplicate detection collapses.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from functions.eventgrid_ingest.notification import (
    CANCELED,
    COMPLETED,
    SCHEDULED,
    STARTED,
    InvalidNotification,
    Notification,
    RawNotification,
    parse_notification,
    parse_time,
)
from functions.shared.ports import Clock, TopicPublisher
from sebridge import lifecycle
from sebridge.contract.events import Envelope, Transition, event_message
from sebridge.imds import InvalidDocument, ScheduledEvent, isoformat_utc
from sebridge.retry import Backoff

log = logging.getLogger("sebridge.functions.eventgrid_ingest")
security_log = logging.getLogger("sebridge.functions.security")

RECORD_VERSION = 1
MAX_PENDING = 16  # envelopes kept unpublished in one record (each decision adds at most one)
WRITE_ATTEMPTS = 6  # optimistic-concurrency rounds before the delivery fails (and is retried)
_RANK = {SCHEDULED: 0, STARTED: 1, COMPLETED: 2, CANCELED: 2}
_ENDS = (COMPLETED, CANCELED)
_FIRST = {
    SCHEDULED: Transition.SCHEDULED,
    STARTED: Transition.STARTED,
    COMPLETED: Transition.COMPLETED,
    CANCELED: Transition.CANCELLED,
}


class StateConflict(Exception):
    """The record changed since it was read (ETag mismatch, or it was created meanwhile)."""


class EventStateStore(Protocol):
    """One JSON document per EventId with optimistic concurrency."""

    def read(self, key: str) -> tuple[Mapping[str, Any] | None, str | None]:
        """(document, etag); (None, None) when there is none. A document that is not JSON is
        returned as None with its etag, so that it can be overwritten."""

    def write(self, key: str, document: Mapping[str, Any], etag: str | None) -> str:
        """Store ``document`` if the record is still ``etag`` (None: only if none exists);
        returns the new etag; raises :class:`StateConflict` otherwise."""


@dataclass(frozen=True)
class EventRecord:
    """What the ingestion remembers of one EventId."""

    event_id: str
    life: lifecycle.Life
    status: str  # the last accepted status, Event Grid's spelling
    at: datetime | None  # the time of the last accepted notification
    last: Mapping[str, Any]  # its IMDS fields (for Updated's changes)
    notification_id: str  # its Event Grid id
    pending: tuple[Mapping[str, Any], ...] = ()  # Envelope.to_dict() not yet known published

    @property
    def ended(self) -> bool:
        return self.life.ended

    def event(self) -> ScheduledEvent:
        return ScheduledEvent.from_imds(self.last)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "eventId": self.event_id,
            "life": self.life.to_json(),
            "status": self.status,
            "at": isoformat_utc(self.at) if self.at else None,
            "last": dict(self.last),
            "notificationId": self.notification_id,
            "pending": [dict(p) for p in self.pending],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> EventRecord:
        """Strict: a damaged record raises ValueError."""
        if obj.get("version") != RECORD_VERSION:
            raise ValueError(f"unknown record version {str(obj.get('version'))[:20]!r}")
        event_id, status, nid = obj.get("eventId"), obj.get("status"), obj.get("notificationId")
        if not isinstance(event_id, str) or not event_id:
            raise ValueError("eventId is missing")
        if status not in _RANK:
            raise ValueError("status is not an Event Grid status")
        if not isinstance(nid, str):
            raise ValueError("notificationId is missing")
        at_text = obj.get("at")
        at = parse_time(at_text) if at_text is not None else None
        if at_text is not None and at is None:
            raise ValueError("at is not a time")
        last = obj.get("last")
        if not isinstance(last, Mapping):
            raise ValueError("last is not an object")
        try:
            ScheduledEvent.from_imds(last)
        except InvalidDocument as exc:
            raise ValueError(f"last is not an event: {exc}") from exc
        pending = obj.get("pending", [])
        if not isinstance(pending, list) or len(pending) > MAX_PENDING:
            raise ValueError("pending is not a short list")
        for item in pending:
            if not isinstance(item, Mapping):
                raise ValueError("a pending envelope is not an object")
            Envelope.from_dict(item)  # raises KeyError/TypeError on a damaged one
        return cls(
            event_id=event_id,
            life=lifecycle.Life.from_json(obj.get("life")),
            status=status,
            at=at,
            last=dict(last),
            notification_id=nid,
            pending=tuple(dict(p) for p in pending),
        )


class Verdict(StrEnum):
    APPLIED = "applied"  # the record changes (with or without a transition)
    DUPLICATE = "duplicate"  # nothing new
    STALE = "stale"  # older than what is known: changes nothing


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str
    transition: Transition | None = None
    message_id: str | None = None
    changes: Mapping[str, Any] | None = None
    record: EventRecord | None = None  # the new record when APPLIED


def _accept(
    record: EventRecord | None,
    n: Notification,
    transition: Transition,
    reason: str,
    changes: Mapping[str, Any] | None = None,
) -> Decision:
    life, message_id = lifecycle.advance(record.life if record else None, transition.value, n.event)
    new = EventRecord(
        event_id=n.event.event_id,
        life=life,
        status=n.status,
        at=n.time,
        last=n.event.to_imds(),
        notification_id=n.id,
        pending=record.pending if record else (),
    )
    return Decision(Verdict.APPLIED, reason, transition, message_id, changes, new)


def _older(n: Notification, record: EventRecord) -> bool:
    return n.time is not None and record.at is not None and n.time < record.at


def decide(record: EventRecord | None, n: Notification) -> Decision:
    """The module's rules: what ``n`` means given what is remembered (pure)."""
    if record is None:
        return _accept(None, n, _FIRST[n.status], "first notification of this EventId")
    if record.ended:
        if n.status in _ENDS:
            return Decision(Verdict.DUPLICATE, "the event has already ended")
        if n.time is None or record.at is None or n.time <= record.at:
            return Decision(Verdict.STALE, f"{n.status} no newer than the event's end")
        return _accept(record, n, _FIRST[n.status], "the EventId came back after its end")
    if _older(n, record):
        return Decision(Verdict.STALE, "older than the last notification taken")
    if n.status in _ENDS:
        return _accept(record, n, _FIRST[n.status], "the event ended")
    if _RANK[n.status] < _RANK[record.status]:
        return Decision(Verdict.STALE, f"{n.status} after {record.status}")
    if n.status == STARTED:
        if record.status == STARTED:
            return Decision(Verdict.DUPLICATE, "already Started")
        return _accept(record, n, Transition.STARTED, "the event started")
    changes = lifecycle.field_changes(record.event(), n.event)
    if not changes:
        return Decision(Verdict.DUPLICATE, "no watched field changed")
    if n.time is not None and record.at is not None and n.time <= record.at:
        return Decision(Verdict.STALE, "another content with the same time: no order to trust")
    return _accept(record, n, Transition.UPDATED, "a watched field changed", changes)


@dataclass(frozen=True)
class IngestOutcome:
    verdict: str  # a Verdict, or "invalid"
    reason: str
    published: tuple[str, ...] = ()  # message ids published by this call (pending included)
    about: Mapping[str, str] = field(default_factory=dict)  # for the invocation line

    @staticmethod
    def describe(n: Notification, transition: Transition | None) -> dict[str, str]:
        """What the invocation line says of a checked notification: ids and names only."""
        about = {
            "eventId": n.event.key,
            "eventType": n.event.event_type,
            "vmName": n.observer.vm_name,
            "status": n.status,
        }
        if transition is not None:
            about["transition"] = transition.value
        return about


def envelope_for(decision: Decision, n: Notification, now: datetime) -> Envelope:
    assert decision.transition is not None and decision.message_id is not None
    return event_message(
        decision.transition,
        n.event,
        n.observer,
        None,
        n.time or now,
        message_id=decision.message_id,
        changes=decision.changes,
        event_grid=n.provenance(),
    )


@dataclass
class Ingestor:
    store: EventStateStore
    publisher: TopicPublisher
    clock: Clock
    sleep: Callable[[float], None] = time.sleep
    attempts: int = WRITE_ATTEMPTS

    def handle_raw(self, raw: RawNotification) -> IngestOutcome:
        """Check, then :meth:`handle`. A notification that cannot be read is logged (a
        security event when a name or id is forged or malformed) and dropped: no redelivery
        can repair it."""
        try:
            notification = parse_notification(raw)
        except InvalidNotification as exc:
            fields = {"eventGridId": str(raw.id)[:100], "reason": exc.reason}
            if exc.security:
                security_log.warning(
                    "security: Event Grid notification refused: %s", exc.reason, extra=fields
                )
            else:
                log.error("Event Grid notification dropped: %s", exc.reason, extra=fields)
            return IngestOutcome("invalid", exc.reason)
        return self.handle(notification)

    def _load(self, key: str) -> tuple[EventRecord | None, str | None]:
        document, etag = self.store.read(key)
        if document is None:
            return None, etag
        try:
            return EventRecord.from_json(document), etag
        except (ValueError, KeyError, TypeError) as exc:
            # Starting afresh republishes at most ids already on the topic (deduplicated).
            log.error("damaged record for %s, starting it afresh: %s", key, exc)
            return None, etag

    def handle(self, n: Notification) -> IngestOutcome:
        key = lifecycle.event_ref(n.event.event_id)
        fields = {"eventId": n.event.key, "eventGridId": n.id, "status": n.status}
        backoff = Backoff(0.02, 0.5, floor=0.005)
        for attempt in range(1, self.attempts + 1):
            record, etag = self._load(key)
            decision = decide(record, n)
            pending = list(record.pending) if record else []
            if decision.verdict is Verdict.APPLIED:
                assert decision.record is not None
                new = decision.record
                if decision.transition is not None:
                    pending.append(envelope_for(decision, n, self.clock()).to_dict())
                new = replace(new, pending=tuple(pending[-MAX_PENDING:]))
                try:
                    etag = self.store.write(key, new.to_json(), etag)
                except StateConflict:
                    delay = backoff.next_delay()
                    log.info("record changed meanwhile, deciding again in %.3f s", delay)
                    self.sleep(delay)
                    continue
            elif not pending:
                log.info("notification changes nothing: %s", decision.reason, extra=fields)
                return IngestOutcome(
                    decision.verdict.value, decision.reason, about=IngestOutcome.describe(n, None)
                )
            else:
                assert record is not None
                new = record
            published = self._publish(new.pending)
            # On a conflict, whoever wrote meanwhile read these as pending and publishes them too.
            with contextlib.suppress(StateConflict):
                self.store.write(key, replace(new, pending=()).to_json(), etag)
            log.info(
                "%s: %s",
                decision.verdict.value,
                decision.reason,
                extra={**fields, "published": list(published), "attempt": attempt},
            )
            return IngestOutcome(
                decision.verdict.value,
                decision.reason,
                published,
                IngestOutcome.describe(n, decision.transition),
            )
        raise StateConflict(f"{key}: record still changing after {self.attempts} attempts")

    def _publish(self, pending: tuple[Mapping[str, Any], ...]) -> tuple[str, ...]:
        ids = []
        for item in pending:
            envelope = Envelope.from_dict(item)
            self.publisher.publish(envelope)
            ids.append(envelope.message_id)
        return tuple(ids)
