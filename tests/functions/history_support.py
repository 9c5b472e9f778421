"""Helpers for the history tests: a lifecycle of contract messages and an in-memory store.

The store stands in for the table only in the core's own tests (the port, not the thing under
test); the adapter is tested against Azurite (tests/integration/test_history_azurite.py).
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.history.core import (
    NAMES,
    Entry,
    EntryRead,
    EventQuery,
    EventSummary,
    Listing,
    StoredSummary,
    StoreUnavailable,
    SummaryConflict,
    event_key,
    select,
    summary_from_properties,
    summary_key,
    summary_properties,
    time_rank,
)
from functions.shared.verified import VerifiedMessage
from sebridge import lifecycle
from sebridge.contract.events import (
    Envelope,
    Observer,
    Transition,
    event_message,
    held_message,
    measured_message,
    parse_message,
    prepared_message,
)
from sebridge.imds import Document, ScheduledEvent
from tests.fixtures import golden
from tests.functions.support import AVAILABILITY_SET_ID, as_verified

T0 = datetime(2026, 11, 22, 1, 0, 0, tzinfo=UTC)
POOL = (
    f"/subscriptions/{golden.SUBSCRIPTION}/resourceGroups/rg-web/providers/"
    "Microsoft.Network/loadBalancers/lb-web/backendAddressPools/pool-a"
)


def imds_event(event_id: str, status: str = "Scheduled", **fields: Any) -> ScheduledEvent:
    raw = {**golden.SCHEDULED, "EventId": event_id, "EventStatus": status, **fields}
    if status == "Started":
        raw["NotBefore"] = ""
    return Document.from_imds({"DocumentIncarnation": 1, "Events": [raw]}).events[0]


@dataclass
class Lifecycle:
    """Builds one event's messages in the order they happen, with the lifecycle's own ids."""

    event_id: str = golden.EVENT_ID
    life: lifecycle.Life | None = None
    clock: datetime = T0
    fields: dict[str, Any] = field(default_factory=dict)
    messages: list[Envelope] = field(default_factory=list)

    def _tick(self, seconds: int = 30) -> datetime:
        self.clock += timedelta(seconds=seconds)
        return self.clock

    def transition(self, name: str, *, impact: dict[str, Any] | None = None, **fields: Any) -> None:
        self.fields.update(fields)
        status = "Started" if name in ("Started", "Completed") else "Scheduled"
        event = imds_event(self.event_id, status, **self.fields)
        self.life, message_id = lifecycle.advance(self.life, name, event)
        changes = {"NotBefore": {"from": "a", "to": "b"}} if name == "Updated" else None
        envelope = event_message(
            Transition(name),
            event,
            golden.OBSERVER,
            1,
            self._tick(),
            message_id=message_id,
            changes=changes,
        )
        if impact is not None:
            envelope.body["data"]["impact"] = impact
        self.messages.append(envelope)

    def measured(self, vm: str, seconds: float, method: str = "freeze-pause") -> None:
        """What VM ``vm`` (of the golden observer's availability set) measured of the event, as
        its forwarder reports it next to its Completed."""
        event = imds_event(self.event_id, "Started", **self.fields)
        assert self.life is not None
        observer = Observer(
            vm_name=vm,
            resource_id=golden.OBSERVER.resource_id.removesuffix(golden.OBSERVER.vm_name) + vm,
            subscription_id=golden.OBSERVER.subscription_id,
            resource_group=golden.OBSERVER.resource_group,
        )
        self.messages.append(
            measured_message(
                event,
                observer,
                1,
                self._tick(1),
                appearance=self.life.appearance,
                impact={"measuredSeconds": seconds, "method": method},
            )
        )

    def approved(self, by: str = "approval-gate", reason: str = "policy") -> None:
        event = imds_event(self.event_id, **self.fields)
        assert self.life is not None
        message_id = lifecycle.message_id(
            lifecycle.event_ref(self.event_id), "Approved", self.life.appearance
        )
        self.messages.append(
            event_message(
                Transition.APPROVED,
                event,
                golden.OBSERVER,
                1,
                self._tick(),
                message_id=message_id,
                approval={"requestedBy": by, "reason": reason},
            )
        )

    def prepared(self, by: str = "lb-pools") -> None:
        event = imds_event(self.event_id, **self.fields)
        cause = self.messages[-1].message_id
        self.messages.append(
            prepared_message(
                event,
                golden.OBSERVER,
                1,
                self._tick(),
                source="urn:sebridge:function:lb-pools",
                prepared_vms=["web-1"],
                cause=cause,
                prepared_by=by,
            )
        )

    def held(self) -> None:
        event = imds_event(self.event_id, **self.fields)
        cause = self.messages[-1].message_id
        self.messages.append(
            held_message(
                event,
                golden.OBSERVER,
                1,
                self._tick(),
                source="urn:sebridge:function:lb-pools",
                cause=cause,
                pool=POOL,
                healthy=0,
                minimum=1,
                vms=["web-1"],
            )
        )


class MemoryHistoryStore:
    """The HistoryStore port in memory, with ETags on summaries (the core's unit tests). Its
    bounds are the table adapter's (``read_all``/``read_per_kind``), so the core is tested
    under the same cut: lifecycle rows are read even when the bulk rows exceed it."""

    def __init__(self, read_all: int = 1000, read_per_kind: int = 300) -> None:
        self.rows: dict[str, dict[str, Entry]] = {}
        self.stored: dict[str, tuple[EventSummary, str]] = {}
        self._etags = itertools.count(1)
        self.lock = threading.Lock()
        self.summary_writes = 0
        self.read_all = read_all
        self.read_per_kind = read_per_kind
        self.faults = 0  # the next calls that raise StoreUnavailable

    def _fault(self) -> None:
        if self.faults > 0:
            self.faults -= 1
            raise StoreUnavailable("injected")

    def add(self, entries: Sequence[Entry]) -> None:
        with self.lock:
            self._fault()
            for entry in entries:
                self.rows.setdefault(entry.summary_key, {}).setdefault(entry.key, entry)

    def entries(self, key: str) -> EntryRead:
        with self.lock:
            rows = sorted(self.rows.get(key, {}).items())
            if len(rows) <= self.read_all:
                return EntryRead([e for _, e in rows])
            found: list[Entry] = []
            complete = True
            for name in NAMES:
                kind = [e for k, e in rows if k.startswith(f"{name.lower()}-")]
                found += kind[: self.read_per_kind]
                complete = complete and len(kind) <= self.read_per_kind
            return EntryRead(found, complete)

    def summary(self, key: str) -> StoredSummary | None:
        with self.lock:
            self._fault()
            found = self.stored.get(key)
            return None if found is None else StoredSummary(found[0], found[1])

    def save_summary(self, summary: EventSummary, stored: StoredSummary | None) -> None:
        with self.lock:
            current = self.stored.get(summary.key)
            if (current[1] if current else None) != (stored.etag if stored else None):
                raise SummaryConflict(summary.key)
            # what the table would hold: the summary read back from its properties
            properties = summary_properties(summary)
            kept = summary_from_properties(properties)
            self.stored[summary.key] = (kept, f"e{next(self._etags)}")
            self.summary_writes += 1

    def scopes(self, event: str) -> list[str]:
        with self.lock:
            return sorted(k for k in self.stored if k.startswith(f"{event}."))

    def latest(self, query: EventQuery) -> Listing:
        with self.lock:
            every = [summary for summary, _ in self.stored.values()]
        return Listing(select(every, query))

    def upcoming(self, start: datetime, end: datetime, limit: int) -> list[EventSummary]:
        with self.lock:
            every = [s for s, _ in self.stored.values() if start <= s.latest.when <= end]
        return sorted(every, key=lambda s: (time_rank(s.latest.when), s.key))[:limit]

    def expired(self, before: datetime, limit: int) -> list[str]:
        with self.lock:
            old = [k for k, (s, _) in self.stored.items() if s.last_recorded < before]
            return sorted(old)[:limit]

    def delete(self, key: str) -> None:
        with self.lock:
            self.rows.pop(key, None)
            self.stored.pop(key, None)


def verified(envelope: Envelope, availability_set: str = AVAILABILITY_SET_ID) -> VerifiedMessage:
    """``envelope`` as the trigger hands it to the history: parsed and verified, its observer
    in ``availability_set``."""
    message = parse_message(envelope.body_bytes(), envelope.message_id)
    return as_verified(message, availability_set=availability_set)


def scope_key(event_id: str = golden.EVENT_ID, availability_set: str = AVAILABILITY_SET_ID) -> str:
    """The summary key of ``event_id`` as seen from ``availability_set``."""
    digest = hashlib.sha256(availability_set.lower().encode("utf-8")).hexdigest()[:16]
    return summary_key(event_key(event_id), digest)


def stored(store: MemoryHistoryStore, key: str | None = None) -> EventSummary | None:
    found = store.summary(key or scope_key())
    return found.summary if found else None
