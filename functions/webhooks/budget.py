"""How many incidents one observer may open in an hour (core).

A verified VM's forwarder can still report an invented event about itself (the scope check
proves who sent it and that it names only VMs of its own set, not that Azure scheduled it). Each
new EventId would open a new PagerDuty incident, so a compromised VM could page on-call as often
as it liked (hostile review of issue 23c, break 2). So new incidents are bounded per observer:
at most ``limit`` (``WEBHOOK_PAGES_PER_OBSERVER_HOUR``) events in the last hour may trigger. An
event that already triggered in that hour triggers again freely (its Updated, its Started, a
redelivery: PagerDuty folds them into the same incident by its dedup key), a resolve always
passes, and a message the app sealed (Event Grid: Azure's own word, functions.shared.seal) is
not the VM's claim and is never counted.

The budget is durable and shared by every instance of the app: one small JSON record per
observer in the pool store (the events' records' container, ``event-<digest>.json``), read and
written under its ETag (functions.adapters.pool_state.update_event), as the events' records are.
The app's clock dates the entries, never the message's time. At most ``limit`` entries per
record, older than an hour dropped at each write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sebridge.imds import isoformat_utc
from sebridge.times import stored

log = logging.getLogger("sebridge.functions.webhooks")

WINDOW = timedelta(hours=1)
KEY_PREFIX = "page-budget:"


class RecordStore(Protocol):
    """The events' records' store (functions.shared.ports.PoolStore): one JSON record per key,
    changed under its ETag."""

    def update_event(self, event_id: str, change: Callable[[dict[str, Any]], bool]) -> None: ...


@dataclass(frozen=True)
class Admission:
    allowed: bool
    used: int  # incidents the observer opened in the last hour, this one included if allowed
    reason: str = ""


def spend(
    record: dict[str, Any], event_key: str, now: datetime, limit: int
) -> tuple[bool, Admission]:
    """Spend one of the observer's incidents on ``event_key`` in ``record`` (changed in place):
    whether the record changed, and the answer (pure)."""
    since = now - WINDOW
    kept: list[dict[str, str]] = []
    pages = record.get("pages")
    for entry in pages if isinstance(pages, list) else []:
        at = stored(entry.get("at")) if isinstance(entry, dict) else None
        event = entry.get("event") if isinstance(entry, dict) else None
        if at is not None and isinstance(event, str) and since < at <= now + WINDOW:
            kept.append({"event": event, "at": isoformat_utc(at)})
    kept = kept[-limit:]
    before = list(pages) if isinstance(pages, list) else None
    if any(entry["event"] == event_key for entry in kept):
        answer = Admission(True, len(kept))
    elif len(kept) < limit:
        kept.append({"event": event_key, "at": isoformat_utc(now)})
        answer = Admission(True, len(kept))
    else:
        answer = Admission(
            False,
            len(kept),
            f"this observer opened {len(kept)} incidents in the last hour "
            f"(WEBHOOK_PAGES_PER_OBSERVER_HOUR={limit})",
        )
    if kept == before:
        return False, answer
    record["pages"] = kept
    return True, answer


@dataclass(frozen=True)
class PageBudget:
    store: RecordStore
    limit: int

    def admit(self, observer_id: str, event_key: str, now: datetime) -> Admission:
        """May ``observer_id`` (its ARM id) open an incident for ``event_key`` (the event in its
        verified scope) now? Spent durably when it may."""
        answers: list[Admission] = []

        def change(record: dict[str, Any]) -> bool:
            changed, answer = spend(record, event_key, now, self.limit)
            answers.append(answer)
            return changed

        self.store.update_event(KEY_PREFIX + observer_id.lower(), change)
        return answers[-1]
