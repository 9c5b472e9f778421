"""Held events and approved members, remembered per backend pool (pure: the pool store keeps the
JSON).

When the capacity guard refuses to drain an event's VMs, lb-pools writes the event into the
state of the pool that blocked it, under that pool's lock: the contract message that asked for
the drain, as it came (so that draining it later is exactly the drain that was held, scope check
and all), when it was held, and its NotBefore. When an event completes and its VMs go back into
a pool, lb-pools reads the pool's held events and tries each again, in NotBefore order.

Why a blob per pool (functions.adapters.pool_state) and not process memory or a NIC tag: the
decision must survive restarts and be seen by every instance of the app; the pool's blob is the
same object whose lease serialises the decisions, so the held list is read and written under the
very lock that guards the drain; and a held event needs its whole message back (its observer,
for the approval that follows), which does not fit a 256-character tag.

An entry whose NotBefore has passed is dropped when read: by then Azure has started the event
and its Started message drains the VMs without the guard. Entries without a readable NotBefore
are kept at most :data:`MAX_AGE`.

The list is bounded per observer, so that one VM cannot push out another's events: every entry
names the (verified) observer whose message asked for the drain, a pool keeps of one observer
what it can honestly report (:func:`allowance`: :data:`MAX_PER_VM` for each distinct VM of its
set its entries name, at least :data:`MAX_PER_OBSERVER`: IMDS shows every member the set's
events, so one forwarder may report a whole wave), and at most :data:`MAX_ENTRIES` in all,
dropping from the observer that holds the most. What goes first is the entry with the latest
NotBefore (an invented event may name any; the honest ones of a wave are due soon). A
compromised VM that invents events floods only its own share; an honest event is never dropped
for a flooder's.

The same state remembers the members that leave without a drain: an event approved early while
some of its VMs are still healthy members (a VM that prepared itself, say) takes them down for
its maintenance although they stay in the pool. Until it ends (or :attr:`Leaving.until`), those
members count as gone for every other decision on the pool (:class:`Leaving`), so a drain that
races the approval cannot take the pool below its minimum either.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from functions.shared.event_record import event_of
from sebridge.contract.cloudevents import CloudEvent
from sebridge.contract.events import DATA_SCHEMA, TransitionMessage
from sebridge.imds import ScheduledEvent, isoformat_utc
from sebridge.times import stored

log = logging.getLogger("sebridge.functions.lb_pools")

VERSION = 1
MAX_AGE = timedelta(days=7)
MAINTENANCE_MARGIN = timedelta(minutes=30)
MAX_ENTRIES = 200  # in one pool
MAX_PER_OBSERVER = 16  # of one observer in one pool, at least (held.allowance)
MAX_PER_VM = 4  # of one observer in one pool, for each distinct VM its held events name


def maintenance_until(event: ScheduledEvent, at: datetime) -> datetime:
    """Until when an event keeps its VMs down, at the latest, seen at ``at``: from NotBefore (or
    ``at``, once started) for its duration (or an hour, unknown) and a margin. Its Completed
    ends it sooner. The members an early approval takes down (:class:`Leaving`) and a drain's
    claim on a NIC (functions.lb_pools.nic_pools) last that long."""
    start = max(event.not_before or at, at)
    duration = event.duration_in_seconds
    seconds = duration if duration is not None and duration > 0 else 3600
    # IMDS durations are seconds to minutes; an absurd one (a forged message) counts as the
    # longest a held event is kept, and the far end of time stays representable.
    seconds = min(seconds, int(MAX_AGE.total_seconds()))
    try:
        return start + timedelta(seconds=seconds) + MAINTENANCE_MARGIN
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class HeldEvent:
    event_id: str
    message_id: str
    body: dict[str, Any]  # the CloudEvent that was held
    held_at: datetime
    not_before: datetime | None
    observer: str = ""  # "<resource group>/<VM>" (lower case) whose message asked for the drain

    @property
    def vms(self) -> frozenset[str]:
        """The VMs the held message names (lower case; none: the observer's own)."""
        data = self.body.get("data")
        names = data.get("Resources") if isinstance(data, Mapping) else None
        if not isinstance(names, list) or not names:
            return frozenset({self.observer})
        return frozenset(str(name).lower() for name in names if isinstance(name, str))

    @property
    def event(self) -> str:
        """The EventId (``event_id`` is the event in its verified scope: ``<event>.<digest>``)."""
        return event_of(self.event_id)

    def expired(self, now: datetime) -> bool:
        if self.not_before is not None and self.not_before <= now:
            return True
        return now - self.held_at > MAX_AGE

    def to_json(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "heldAt": isoformat_utc(self.held_at),
            "notBefore": isoformat_utc(self.not_before) if self.not_before else None,
            "observer": self.observer,
            "message": self.body,
        }


def body_of(message: TransitionMessage) -> dict[str, Any]:
    """The CloudEvent body of a parsed message again (parse_message reads it back the same)."""
    return CloudEvent(
        id=message.message_id or "",
        source=message.source,
        type=message.transition.cloud_event_type,
        subject=message.event_id,
        time=message.time,
        dataschema=DATA_SCHEMA,
        data=message.data,
    ).to_dict()


def entry_for(message: TransitionMessage, now: datetime, *, key: str = "") -> HeldEvent:
    """The held entry of ``message``, under ``key`` (the event in its verified scope,
    VerifiedMessage.scoped_key; default: the bare EventId)."""
    event = message.event
    assert event is not None
    return HeldEvent(
        event_id=key or event.key,
        message_id=message.message_id or event.key,
        body=body_of(message),
        held_at=now,
        not_before=event.not_before,
        observer=observer_key(message),
    )


def observer_key(message: TransitionMessage) -> str:
    observer = message.observer
    return f"{observer.resource_group}/{observer.vm_name}".lower()


def read(state: Mapping[str, Any]) -> dict[str, HeldEvent]:
    """The held events in a pool's state; unreadable entries are skipped with a warning."""
    held = state.get("held")
    if not isinstance(held, Mapping):
        return {}
    result: dict[str, HeldEvent] = {}
    for event_id, entry in held.items():
        if not isinstance(entry, Mapping):
            log.warning("unreadable held entry dropped", extra={"eventId": str(event_id)[:64]})
            continue
        held_at, body = stored(entry.get("heldAt")), entry.get("message")
        message_id = entry.get("messageId")
        if held_at is None or not isinstance(body, dict) or not isinstance(message_id, str):
            log.warning("unreadable held entry dropped", extra={"eventId": str(event_id)[:64]})
            continue
        observer = entry.get("observer")
        result[str(event_id)] = HeldEvent(
            str(event_id),
            message_id,
            body,
            held_at,
            stored(entry.get("notBefore")),
            observer if isinstance(observer, str) else "",
        )
    return result


def write(held: Mapping[str, HeldEvent]) -> dict[str, Any]:
    """A pool's state with these held events (and no leaving members)."""
    return PoolState(dict(held), {}).dump()


def allowance(own: Iterable[HeldEvent]) -> int:
    """How many held events one observer may have in a pool: what it can honestly report.
    IMDS shows an observer every event of its availability set (or scale set), so an honest
    observer of a maintenance wave reports one or more events for each VM of its set:
    MAX_PER_VM for each distinct VM its entries name (the scope check lets them name only VMs
    of its own set, so a flooder's share is bounded by its set's size too), and at least
    MAX_PER_OBSERVER."""
    vms = {vm for entry in own for vm in entry.vms}
    return max(MAX_PER_OBSERVER, MAX_PER_VM * len(vms))


def _drop_order(entry: HeldEvent) -> tuple[datetime, float]:
    """Which entry goes first when some must (the greatest): the latest NotBefore (an invented
    event is free to name a far one; the honest ones of a wave are due soon), then the one held
    longest (a flood's newest stay, so the flooder cannot pin old entries)."""
    return (entry.not_before or datetime.max.replace(tzinfo=UTC), -entry.held_at.timestamp())


def bounded(entries: Iterable[HeldEvent]) -> list[HeldEvent]:
    """``entries`` within the bounds: at most :func:`allowance` of each observer, at most
    MAX_ENTRIES in all (dropping from the observer that holds the most); what goes first is
    the latest NotBefore (:func:`_drop_order`)."""
    by_observer: dict[str, list[HeldEvent]] = {}
    for entry in sorted(entries, key=lambda e: e.held_at):
        by_observer.setdefault(entry.observer, []).append(entry)
    for observer, own in by_observer.items():
        limit = allowance(own)
        if len(own) <= limit:
            continue
        for dropped in sorted(own, key=_drop_order, reverse=True)[: len(own) - limit]:
            _dropped(dropped, f"{observer or 'an observer'} holds more than {limit}")
            own.remove(dropped)
    while sum(len(own) for own in by_observer.values()) > MAX_ENTRIES:
        most = max(by_observer, key=lambda o: (len(by_observer[o]), o))
        dropped = max(by_observer[most], key=_drop_order)
        by_observer[most].remove(dropped)
        _dropped(dropped, f"the pool holds more than {MAX_ENTRIES}")
    return [entry for own in by_observer.values() for entry in own]


def _dropped(entry: HeldEvent, why: str) -> None:
    log.warning(
        "held event %s dropped from the pool's list: %s",
        entry.event_id,
        why,
        extra={"eventId": entry.event_id, "observer": entry.observer, "reason": why},
    )


@dataclass(frozen=True)
class Leaving:
    """Members of a pool that an approved event takes down while they stay in the pool."""

    event_id: str
    ip_configurations: frozenset[str]  # lower case
    until: datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "ipConfigurations": sorted(self.ip_configurations),
            "until": isoformat_utc(self.until),
        }


def _read_leaving(state: Mapping[str, Any], key: str = "leaving") -> dict[str, Leaving]:
    raw = state.get(key)
    if not isinstance(raw, Mapping):
        return {}
    result: dict[str, Leaving] = {}
    for event_id, entry in raw.items():
        until = stored(entry.get("until")) if isinstance(entry, Mapping) else None
        ipcs = entry.get("ipConfigurations") if isinstance(entry, Mapping) else None
        if until is None or not isinstance(ipcs, list):
            log.warning("unreadable leaving entry dropped", extra={"eventId": str(event_id)[:64]})
            continue
        result[str(event_id)] = Leaving(
            str(event_id), frozenset(str(i).lower() for i in ipcs if isinstance(i, str)), until
        )
    return result


@dataclass
class PoolState:
    """Everything the pool's blob remembers: its held events, its leaving members, and the
    members the bridge drained out of it (``out``, per event: the pool's size for a budget of
    maximum unavailable members counts them, functions.lb_pools.capacity.Budget)."""

    held: dict[str, HeldEvent]
    leaving: dict[str, Leaving]
    out: dict[str, Leaving] = field(default_factory=dict)

    @classmethod
    def load(cls, state: Mapping[str, Any]) -> PoolState:
        return cls(read(state), _read_leaving(state), _read_leaving(state, "out"))

    def dump(self) -> dict[str, Any]:
        kept = bounded(self.held.values())
        state: dict[str, Any] = {
            "version": VERSION,
            "held": {e.event_id: e.to_json() for e in sorted(kept, key=lambda e: e.held_at)},
        }
        if self.leaving:
            state["leaving"] = {e.event_id: e.to_json() for e in self.leaving.values()}
        if self.out:
            state["out"] = {e.event_id: e.to_json() for e in self.out.values()}
        return state

    def absent(self, now: datetime) -> frozenset[str]:
        """The members the bridge has out of the pool for events not ended, as of ``now``."""
        return frozenset(
            ipc
            for entry in self.out.values()
            if entry.until > now
            for ipc in entry.ip_configurations
        )

    def reserved(self, now: datetime, *, besides: str = "") -> frozenset[str]:
        """The members other events (not ``besides``) take down, as of ``now``."""
        return frozenset(
            ipc
            for entry in self.leaving.values()
            if entry.event_id != besides and entry.until > now
            for ipc in entry.ip_configurations
        )

    def forget(self, event_id: str, now: datetime) -> bool:
        """Drop ``event_id`` (held or leaving) and what has expired; whether anything changed."""
        before = (len(self.held), len(self.leaving), len(self.out))
        self.held.pop(event_id, None)
        self.leaving = {
            key: entry
            for key, entry in self.leaving.items()
            if key != event_id and entry.until > now
        }
        self.out = {
            key: entry for key, entry in self.out.items() if key != event_id and entry.until > now
        }
        return (len(self.held), len(self.leaving), len(self.out)) != before

    def mentions(self, event_id: str) -> bool:
        return event_id in self.held or event_id in self.leaving or event_id in self.out
