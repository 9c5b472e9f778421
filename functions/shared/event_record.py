"""What the bridge knows of one event now: one record per EventId (pure: the pool store keeps the
JSON, functions.adapters.pool_state).

Messages about one event reach the workflows on different subscriptions, each in its own order:
lb-pools' ``Prepared`` for the event's first Resources can reach the gate after the ``Updated``
that added VMs, and an Approve link carries the VMs of the card it was on. Deciding from what
such a message (or token) happened to carry approved events whose other VMs were still healthy
members of their pools (hostile review of issue 23, breaks 1 and 2). So every decision that
starts maintenance early asks what the event names *now*: the record keeps, per scope (the
verified placement: availability set, scale set or VM, functions.shared.verified), the Resources
of the newest lifecycle transition seen (Scheduled, Updated, Started: by observation time), and
the ARM ids of the VMs verified in that scope (so a sealed Event Grid message whose VM is gone,
a Completed after a Terminate, still names the scope it was in: functions.shared.scope).

Scopes are kept apart: what one scope says of an EventId never changes what another's decisions
read (an EventId is shown only to one scope's VMs; a VM elsewhere that sends the same EventId
only writes its own scope). At most :data:`MAX_SCOPES` per record, the least recently written
dropped first.

The same record holds the index of held events (``pools``: which pools last held the event), so
an Approve link that names only its event can be checked for a hold.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sebridge.contract.events import Transition
from sebridge.imds import isoformat_utc

log = logging.getLogger("sebridge.functions.event_record")

MAX_SCOPES = 8
MAX_MEMBERS = 256
NOTED = (Transition.SCHEDULED, Transition.UPDATED, Transition.STARTED)
# Of two transitions observed at the same moment, the later in an event's life is the newer.
_RANK = {t.value: rank for rank, t in enumerate(NOTED)}


@dataclass(frozen=True)
class ScopeView:
    """What one scope last said of the event."""

    placement: str  # lower case
    resources: tuple[str, ...]  # the VMs the event names (empty: the observer)
    observed_at: datetime
    transition: str
    members: frozenset[str]  # lower-case ARM ids of the VMs verified in this scope


def rank(transition: str) -> int:
    """The order of lifecycle transitions in an event's life (for two seen at one moment)."""
    return _RANK.get(transition, 0)


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def scope_of(record: Mapping[str, Any], placement: str) -> ScopeView | None:
    """The scope's view of the event, or None (nothing noted, or unreadable)."""
    scopes = record.get("scopes")
    entry = scopes.get(placement.lower()) if isinstance(scopes, Mapping) else None
    if not isinstance(entry, Mapping):
        return None
    observed = _time(entry.get("observedAt"))
    resources = entry.get("resources")
    members = entry.get("members")
    if observed is None or not isinstance(resources, list):
        return None
    return ScopeView(
        placement.lower(),
        tuple(str(r) for r in resources if isinstance(r, str)),
        observed,
        str(entry.get("transition", "")),
        frozenset(str(m).lower() for m in (members if isinstance(members, list) else [])),
    )


def placement_of(record: Mapping[str, Any], vm_id: str) -> str | None:
    """The placement of the scope in which the VM ``vm_id`` (an ARM id) was verified for this
    event, if any."""
    scopes = record.get("scopes")
    if not isinstance(scopes, Mapping):
        return None
    wanted = vm_id.lower()
    for placement in sorted(scopes):
        view = scope_of(record, placement)
        if view is not None and wanted in view.members:
            return view.placement
    return None


def note(
    record: dict[str, Any],
    *,
    placement: str,
    resources: Iterable[str],
    observed_at: datetime,
    transition: Transition,
    members: Iterable[str],
    now: datetime,
) -> bool:
    """Note a verified lifecycle transition of the event in ``record`` (changed in place):
    its Resources if it is the scope's newest, its verified VMs in any case. Whether anything
    changed (nothing is written otherwise)."""
    if transition not in NOTED:
        return False
    scopes = record.setdefault("scopes", {})
    if not isinstance(scopes, dict):
        scopes = record["scopes"] = {}
    key = placement.lower()
    before = scope_of(record, key)
    ids = (set(before.members) if before else set()) | {m.lower() for m in members}
    if before is None or (observed_at, _RANK[transition.value]) >= (
        before.observed_at,
        _RANK.get(before.transition, 0),
    ):
        names, at, kind = tuple(resources), observed_at, transition.value
    else:  # an older message: its VMs are still this scope's, its Resources are not news
        names, at, kind = before.resources, before.observed_at, before.transition
    unchanged = before is not None and (names, at, kind, ids) == (
        before.resources,
        before.observed_at,
        before.transition,
        set(before.members),
    )
    if unchanged:
        return False
    scopes[key] = {
        "resources": list(names),
        "observedAt": isoformat_utc(at),
        "transition": kind,
        "members": sorted(ids)[:MAX_MEMBERS],
        "updatedAt": isoformat_utc(now),
    }
    _bound(scopes)
    return True


def _bound(scopes: dict[str, Any]) -> None:
    def written(key: str) -> str:
        entry = scopes[key]
        return str(entry.get("updatedAt", "")) if isinstance(entry, dict) else ""

    while len(scopes) > MAX_SCOPES:
        log.warning("event record: dropped the oldest of more than %d scopes", MAX_SCOPES)
        del scopes[min(scopes, key=written)]


def held_pools(record: Mapping[str, Any]) -> list[str]:
    pools = record.get("pools")
    return [p for p in pools if isinstance(p, str)] if isinstance(pools, list) else []


def with_held_pools(record: dict[str, Any], event_id: str, pools: Iterable[str]) -> bool:
    """Set the pools that hold the event; whether that changed anything."""
    wanted = sorted({p.lower() for p in pools})
    if held_pools(record) == wanted and (record.get("eventId") == event_id or not record):
        return False
    record["eventId"] = event_id
    record["pools"] = wanted
    return True
