"""Consecutive IMDS documents -> lifecycle transitions. Pure: no I/O, no clock.

The diff is keyed by EventId (case-insensitive) and compares content, never the incarnation
number alone: IMDS may reset DocumentIncarnation to a low number after 24 h without calls, and
it may change content without bumping it. Rules (DESIGN.md):

- new EventId, Scheduled          -> Scheduled
- new EventId, first seen Started -> Started (a hardware failure skips Scheduled)
- Scheduled -> Started            -> Started
- Scheduled, a watched field changed -> Updated (with the changes)
- vanished after Started          -> Completed
- vanished while Scheduled        -> Cancelled, unless its NotBefore had passed: Azure starts
  every event at NotBefore, so it ran while nobody looked (typically the VM's own reboot took
  the forwarder down before it saw Started) -> Completed
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sebridge.contract.events import Transition
from sebridge.imds import Document, ScheduledEvent
from sebridge.lifecycle import field_changes


@dataclass(frozen=True)
class Change:
    transition: Transition
    event: ScheduledEvent
    changes: Mapping[str, Any] | None = None  # {"NotBefore": {"from": ..., "to": ...}} for Updated


def diff(
    known: Mapping[str, ScheduledEvent], document: Document, now: datetime | None = None
) -> list[Change]:
    """Transitions from the last known events (by key) to ``document``, in a stable order:
    the document's events in their order, then vanished events in the order they were known.
    ``now`` (aware) tells a vanished Scheduled event whose NotBefore has passed from a
    cancelled one; without it, vanishing while Scheduled is always Cancelled."""
    out: list[Change] = []
    current: set[str] = set()
    for event in document.events:
        current.add(event.key)
        before = known.get(event.key)
        if before is None:
            out.append(
                Change(Transition.STARTED if event.is_started else Transition.SCHEDULED, event)
            )
        elif event.is_started and not before.is_started:
            out.append(Change(Transition.STARTED, event))
        elif not event.is_started and not before.is_started:
            changes = field_changes(before, event)
            if changes:
                out.append(Change(Transition.UPDATED, event, changes))
        # Started -> Started: NotBefore is "" and nothing else is announced; Started -> Scheduled
        # does not happen in IMDS, and reporting it would only confuse the workflows.
    for key, before in known.items():
        if key not in current:
            ran = before.is_started or (
                now is not None and before.not_before is not None and before.not_before <= now
            )
            out.append(Change(Transition.COMPLETED if ran else Transition.CANCELLED, before))
    return out


def index(events: Iterable[ScheduledEvent]) -> dict[str, ScheduledEvent]:
    """Events by key, in document order: what the forwarder remembers between polls."""
    return {event.key: event for event in events}
