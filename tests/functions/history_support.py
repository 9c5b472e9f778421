"""Helpers for the history tests: a lifecycle of contract messages and an in-memory store.

The store stands in for the table only in the core's own tests (the port, not the thing under
test); the adapter is tested against Azurite (tests/integration/test_history_azurite.py).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.history.core import (
    Entry,
    EventQuery,
    EventSummary,
    SummaryConflict,
    event_key,
)
from sebridge import lifecycle
from sebridge.contract.events import (
    Envelope,
    Transition,
    event_message,
    held_message,
    prepared_message,
)
from sebridge.imds import Document, ScheduledEvent
from tests.fixtures import golden

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
    """The HistoryStore port in memory, with ETags on summaries (the core's unit tests)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Entry]] = {}
        self.stored: dict[str, tuple[EventSummary, str]] = {}
        self._etags = itertools.count(1)
        self.lock = threading.Lock()
        self.summary_writes = 0

    def add(self, entries: Sequence[Entry]) -> None:
        with self.lock:
            for entry in entries:
                self.rows.setdefault(event_key(entry.event_id), {})[entry.key] = entry

    def entries(self, key: str) -> list[Entry]:
        with self.lock:
            return list(self.rows.get(key, {}).values())

    def summary(self, key: str) -> tuple[EventSummary | None, str | None]:
        with self.lock:
            found = self.stored.get(key)
            return (None, None) if found is None else found

    def save_summary(self, summary: EventSummary, etag: str | None) -> None:
        with self.lock:
            current = self.stored.get(summary.key)
            if (current[1] if current else None) != etag:
                raise SummaryConflict(summary.key)
            self.stored[summary.key] = (summary, f"e{next(self._etags)}")
            self.summary_writes += 1

    def summaries(self, query: EventQuery) -> list[EventSummary]:
        with self.lock:
            return [summary for summary, _ in self.stored.values()]

    def expired(self, before: datetime, limit: int) -> list[str]:
        with self.lock:
            old = [k for k, (s, _) in self.stored.items() if s.last_seen < before]
            return sorted(old)[:limit]

    def delete(self, key: str) -> None:
        with self.lock:
            self.rows.pop(key, None)
            self.stored.pop(key, None)
