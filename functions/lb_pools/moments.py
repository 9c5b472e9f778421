"""The drain moment of an event, kept durable (pure: the pool store keeps the JSON in the event's
record, functions.shared.event_record; Service Bus keeps the scheduled message).

Capacity is lost from the moment a VM drains, so lb-pools drains an event at its **drain
moment** (sebridge.timing.drain_moment: NotBefore minus the event type's lead, at first sight
for short notices, Preempt and Terminate), not when it is first seen. A moment still ahead is
kept in two places:

- a message to lb-pools itself, scheduled on the ``drain-moments`` queue for that moment
  (Service Bus keeps it across restarts of the app; ``ScheduledEnqueueTimeUtc``), carrying only
  the event's id and the moment's **token**;
- the event's record (``drainMoment``): the moment, its token, the scheduled message's sequence
  number, and the newest contract message that asked for the drain (what is drained when it is
  due: verified again then, like a held event).

An Updated that moves the moment schedules the new one and cancels the old (a new token); one
that leaves it keeps the scheduled message and only refreshes the message to drain. A Cancelled
or Completed drops the entry and cancels its message; a Started drains at once and does the
same. A redelivered Scheduled finds its token recorded with a sequence number and schedules
nothing. When a scheduled message arrives, it drains only if its token is the record's and the
moment has not fired yet: a stale or superseded delivery (a cancel that lost the race, a message
scheduled twice across a crash) changes nothing, so a moment fires once. The record is written
after the message is scheduled: a crash in between leaves at most a message whose token the
record may never name (a no-op when it arrives) and a redelivery schedules it again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sebridge.imds import isoformat_utc

KEY = "drainMoment"  # in the event's record
DUE_SCHEMA_VERSION = 1
DUE_COMMAND = "drain-due"
MAX_DUE_BYTES = 1024


class DueError(ValueError):
    """A drain-moments message that is not one lb-pools scheduled (the message says why)."""


def token(event_id: str, at: datetime) -> str:
    """The moment's token: the same event and moment give the same token."""
    text = f"{event_id.strip().lower()}|{isoformat_utc(at)}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:24]


@dataclass(frozen=True)
class Pending:
    """An event's drain moment as its record keeps it."""

    at: datetime
    token: str
    sequence: int | None  # the scheduled message's (None: not scheduled yet)
    fired: bool  # it was due and lb-pools drained
    message_id: str
    body: Mapping[str, Any]  # the contract message to drain when it is due

    def to_json(self) -> dict[str, Any]:
        return {
            "at": isoformat_utc(self.at),
            "token": self.token,
            "sequence": self.sequence,
            "fired": self.fired,
            "messageId": self.message_id,
            "message": dict(self.body),
        }


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def pending(record: Mapping[str, Any]) -> Pending | None:
    """The event's drain moment, or None (none recorded, or unreadable)."""
    entry = record.get(KEY)
    if not isinstance(entry, Mapping):
        return None
    at = _time(entry.get("at"))
    tok = entry.get("token")
    sequence = entry.get("sequence")
    body = entry.get("message")
    if at is None or not isinstance(tok, str) or not isinstance(body, Mapping):
        return None
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int)):
        sequence = None
    return Pending(
        at=at,
        token=tok,
        sequence=sequence,
        fired=entry.get("fired") is True,
        message_id=str(entry.get("messageId", "")),
        body=body,
    )


def with_pending(record: dict[str, Any], event_id: str, entry: Pending) -> bool:
    """Record ``entry`` as the event's drain moment; whether that changed anything."""
    wanted = entry.to_json()
    if record.get(KEY) == wanted:
        return False
    record.setdefault("eventId", event_id)
    record[KEY] = wanted
    return True


def with_fired(record: dict[str, Any], tok: str) -> bool:
    """Mark the moment ``tok`` fired (only if it is still the record's)."""
    entry = pending(record)
    if entry is None or entry.token != tok or entry.fired:
        return False
    record[KEY] = {**record[KEY], "fired": True}
    return True


def without(record: dict[str, Any]) -> bool:
    """Drop the event's drain moment; whether there was one."""
    return record.pop(KEY, None) is not None


def due_body(event_id: str, tok: str) -> bytes:
    """The scheduled message's body: which event, which moment (nothing else is trusted from
    it: the record says what to drain)."""
    return json.dumps(
        {
            "schemaVersion": DUE_SCHEMA_VERSION,
            "command": DUE_COMMAND,
            "eventId": event_id,
            "token": tok,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def parse_due(body: bytes) -> tuple[str, str]:
    """(event id, token) of a drain-moments message; :class:`DueError` if it is not one."""
    if len(body) > MAX_DUE_BYTES:
        raise DueError(f"larger than {MAX_DUE_BYTES} bytes")
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DueError(f"not JSON: {exc}") from None
    if not isinstance(obj, Mapping):
        raise DueError("not a JSON object")
    if obj.get("schemaVersion") != DUE_SCHEMA_VERSION or obj.get("command") != DUE_COMMAND:
        raise DueError(f"not a {DUE_COMMAND} command of schema version {DUE_SCHEMA_VERSION}")
    event_id, tok = obj.get("eventId"), obj.get("token")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 64:
        raise DueError("eventId is missing or not a short string")
    if not isinstance(tok, str) or not 0 < len(tok) <= 64:
        raise DueError("token is missing or not a short string")
    return event_id.strip().lower(), tok
