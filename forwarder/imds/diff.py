"""Consecutive IMDS documents -> lifecycle transitions. Pure: no I/O, no clock.

The diff is keyed by EventId (case-insensitive) and compares content, never the incarnation
number alone: IMDS may reset DocumentIncarnation to a low number after 24 h without calls, and
it may change content without bumping it. Rules (DESIGN.md):

- new EventId, Scheduled          -> Scheduled
- new EventId, first seen Started -> Started (a hardware failure skips Scheduled)
- Scheduled -> Started            -> Started
- Scheduled, a watched field changed -> Updated (with the changes)
- vanished after Started          -> Completed
- vanished while Scheduled        -> Cancelled, unless Started could have come and gone unseen:
  its NotBefore has passed (Azure starts every event at NotBefore) *and* the observation gap
  (from the last observation that showed the event to this one, a restart included) is at
  least :data:`STARTED_HIDDEN_BY_GAP`. Then it ran while nobody looked (typically the VM's own
  reboot took the forwarder down before it saw Started) -> Completed.

Why a gap of 30 s: a Started event stays in the document until the maintenance is over, which
takes minutes (Microsoft's realistic timings, the medians of events sent to customers: Started
for 5 to 10 minutes, Freeze included). Watched at 1 Hz, the forwarder cannot miss it: a vanished
Scheduled event it watched without a gap was cancelled, whatever its NotBefore says. Polling
alone never makes a gap that long (a failed poll is retried within 5 s, a request gives up
after 10 s); a restart, a long IMDS outage or the VM's own pause can. The threshold keeps a
wide margin on both sides: 6 x the longest gap one failed request makes, a tenth of a typical
Started.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sebridge.contract.events import Transition
from sebridge.imds import Document, ScheduledEvent
from sebridge.lifecycle import field_changes

STARTED_HIDDEN_BY_GAP = timedelta(seconds=30)


@dataclass(frozen=True)
class Change:
    transition: Transition
    event: ScheduledEvent
    changes: Mapping[str, Any] | None = None  # {"NotBefore": {"from": ..., "to": ...}} for Updated


def could_have_run_unseen(
    event: ScheduledEvent, now: datetime | None, last_seen: datetime | None
) -> bool:
    """Whether a Scheduled event that vanished between ``last_seen`` (the last observation that
    showed it; None = unknown, e.g. a state file from before this rule) and ``now`` (the first
    that did not) may have started and ended in between."""
    if now is None or event.not_before is None or event.not_before > now:
        return False
    return last_seen is None or now - last_seen >= STARTED_HIDDEN_BY_GAP


def diff(
    known: Mapping[str, ScheduledEvent],
    document: Document,
    now: datetime | None = None,
    *,
    last_seen: datetime | None = None,
) -> list[Change]:
    """Transitions from the last known events (by key) to ``document``, in a stable order:
    the document's events in their order, then vanished events in the order they were known.

    ``now`` (aware) is when ``document`` was observed and ``last_seen`` when ``known`` was; they
    tell a vanished Scheduled event that may have run unseen (Completed) from a cancelled one
    (see :func:`could_have_run_unseen`). Without ``now``, vanishing while Scheduled is always
    Cancelled; without ``last_seen`` the gap is taken to be long."""
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
            ran = before.is_started or could_have_run_unseen(before, now, last_seen)
            out.append(Change(Transition.COMPLETED if ran else Transition.CANCELLED, before))
    return out


def index(events: Iterable[ScheduledEvent]) -> dict[str, ScheduledEvent]:
    """Events by key, in document order."""
    return {event.key: event for event in events}


def remember(
    known: Mapping[str, ScheduledEvent], events: Iterable[ScheduledEvent]
) -> dict[str, ScheduledEvent]:
    """What to remember after a document (by key, in document order): its events, except that
    Started never goes back. An event last seen Started that reads Scheduled again (IMDS never
    does it, but a garbled or replayed document can) is remembered Started, so that seeing it
    Started again is no transition: remembered as Scheduled, it would be reported Started a
    second time, under the id of the first."""
    out: dict[str, ScheduledEvent] = {}
    for event in events:
        before = known.get(event.key)
        regressed = before is not None and before.is_started and not event.is_started
        out[event.key] = before if regressed and before is not None else event
    return out
