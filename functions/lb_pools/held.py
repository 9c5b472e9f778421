"""Held events, remembered per backend pool (pure: the pool store keeps the JSON).

When the capacity guard refuses to drain an event's VMs, lb-pools writes the event into the
state of the pool that blocked it, under that pool's lock: the contract message that asked for
the drain, as it came (so that draining it later is exactly the drain that was held, scope check
and all), when it was held, and its NotBefore. When an event completes and its VMs go back into
a pool, lb-pools reads the pool's held events and tries each again, oldest first.

Why a blob per pool (functions.adapters.pool_state) and not process memory or a NIC tag: the
decision must survive restarts and be seen by every instance of the app; the pool's blob is the
same object whose lease serialises the decisions, so the held list is read and written under the
very lock that guards the drain; and a held event needs its whole message back (its observer,
for the approval that follows), which does not fit a 256-character tag.

An entry whose NotBefore has passed is dropped when read: by then Azure has started the event
and its Started message drains the VMs without the guard. Entries without a readable NotBefore
are kept at most :data:`MAX_AGE`. A pool keeps at most :data:`MAX_ENTRIES` (oldest dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sebridge.contract.cloudevents import CloudEvent
from sebridge.contract.events import DATA_SCHEMA, TransitionMessage
from sebridge.imds import isoformat_utc

log = logging.getLogger("sebridge.functions.lb_pools")

VERSION = 1
MAX_AGE = timedelta(days=7)
MAX_ENTRIES = 100


@dataclass(frozen=True)
class HeldEvent:
    event_id: str
    message_id: str
    body: dict[str, Any]  # the CloudEvent that was held
    held_at: datetime
    not_before: datetime | None

    def expired(self, now: datetime) -> bool:
        if self.not_before is not None and self.not_before <= now:
            return True
        return now - self.held_at > MAX_AGE

    def to_json(self) -> dict[str, Any]:
        return {
            "messageId": self.message_id,
            "heldAt": isoformat_utc(self.held_at),
            "notBefore": isoformat_utc(self.not_before) if self.not_before else None,
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


def entry_for(message: TransitionMessage, now: datetime) -> HeldEvent:
    event = message.event
    assert event is not None
    return HeldEvent(
        event_id=event.key,
        message_id=message.message_id or event.key,
        body=body_of(message),
        held_at=now,
        not_before=event.not_before,
    )


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


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
        held_at, body = _time(entry.get("heldAt")), entry.get("message")
        message_id = entry.get("messageId")
        if held_at is None or not isinstance(body, dict) or not isinstance(message_id, str):
            log.warning("unreadable held entry dropped", extra={"eventId": str(event_id)[:64]})
            continue
        result[str(event_id)] = HeldEvent(
            str(event_id), message_id, body, held_at, _time(entry.get("notBefore"))
        )
    return result


def write(held: Mapping[str, HeldEvent]) -> dict[str, Any]:
    newest = sorted(held.values(), key=lambda e: e.held_at)[-MAX_ENTRIES:]
    return {"version": VERSION, "held": {e.event_id: e.to_json() for e in newest}}
