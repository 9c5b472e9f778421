"""The drain moment of an event, kept durable (the pool store keeps the JSON in the event's
record, functions.shared.event_record; Service Bus keeps the scheduled message: both through
their ports, functions.shared.ports).

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
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.shared.ports import MomentScheduler, PoolStore
from sebridge.imds import isoformat_utc

log = logging.getLogger("sebridge.functions.moments")

KEY = "drainMoment"  # in the event's record: lb-pools' drain
DECIDE_KEY = "decideMoment"  # the gate's decision when a maintenance window opens
DUE_SCHEMA_VERSION = 1
DUE_COMMAND = "drain-due"
DECIDE_COMMAND = "decide-due"
COMMANDS = {DUE_COMMAND: KEY, DECIDE_COMMAND: DECIDE_KEY}
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


def pending(record: Mapping[str, Any], key: str = KEY) -> Pending | None:
    """The event's drain (or ``key``'s) moment, or None (none recorded, or unreadable)."""
    entry = record.get(key)
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


def with_pending(record: dict[str, Any], event_id: str, entry: Pending, key: str = KEY) -> bool:
    """Record ``entry`` as the event's drain (or ``key``'s) moment; whether that changed
    anything."""
    wanted = entry.to_json()
    if record.get(key) == wanted:
        return False
    record.setdefault("eventId", event_id)
    record[key] = wanted
    return True


def with_fired(record: dict[str, Any], tok: str, key: str = KEY) -> bool:
    """Mark the moment ``tok`` fired (only if it is still the record's)."""
    entry = pending(record, key)
    if entry is None or entry.token != tok or entry.fired:
        return False
    record[key] = {**record[key], "fired": True}
    return True


def without(record: dict[str, Any], key: str = KEY) -> bool:
    """Drop the event's drain (or ``key``'s) moment; whether there was one."""
    return record.pop(key, None) is not None


def due_body(event_id: str, tok: str, command: str = DUE_COMMAND) -> bytes:
    """The scheduled message's body: which event, which moment (nothing else is trusted from
    it: the record says what to drain)."""
    return json.dumps(
        {
            "schemaVersion": DUE_SCHEMA_VERSION,
            "command": command,
            "eventId": event_id,
            "token": tok,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def parse_due(body: bytes) -> tuple[str, str, str]:
    """(command, event id, token) of a drain-moments message; :class:`DueError` if it is not
    one (``drain-due``: lb-pools drains; ``decide-due``: the gate decides again, a maintenance
    window opened)."""
    if len(body) > MAX_DUE_BYTES:
        raise DueError(f"larger than {MAX_DUE_BYTES} bytes")
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DueError(f"not JSON: {exc}") from None
    if not isinstance(obj, Mapping):
        raise DueError("not a JSON object")
    command = obj.get("command")
    if obj.get("schemaVersion") != DUE_SCHEMA_VERSION or command not in COMMANDS:
        raise DueError(
            f"not a {' or '.join(COMMANDS)} command of schema version {DUE_SCHEMA_VERSION}"
        )
    event_id, tok = obj.get("eventId"), obj.get("token")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 64:
        raise DueError("eventId is missing or not a short string")
    if not isinstance(tok, str) or not 0 < len(tok) <= 64:
        raise DueError("token is missing or not a short string")
    return str(command), event_id.strip().lower(), tok


@dataclass(frozen=True)
class MomentBook:
    """One kind of moment (``key`` in the event's record, ``command`` on the queue), kept the
    way the module's docstring says: lb-pools' drains and the gate's decisions when a
    maintenance window opens both use it."""

    records: PoolStore
    scheduler: MomentScheduler
    key: str = KEY
    command: str = DUE_COMMAND

    def read(self, event_id: str) -> Pending | None:
        return pending(self.records.read_event(event_id), self.key)

    def set(self, event_id: str, at: datetime, message_id: str, body: Mapping[str, Any]) -> None:
        """The event's moment is ``at``, to act on ``body`` then: scheduled once (a moment
        already scheduled only gets the newer message), the one it replaces cancelled."""
        entry = self.read(event_id)
        tok = token(event_id, at)
        if entry is not None and entry.token == tok and entry.sequence is not None:
            if not entry.fired and _newer(body, entry.body):
                fresh = Pending(at, tok, entry.sequence, False, message_id, body)
                self._write(event_id, fresh)
            return
        sequence = self.scheduler.schedule(
            due_body(event_id, tok, self.command), at, f"{self.command}:{event_id}:{tok}"
        )
        self._write(event_id, Pending(at, tok, sequence, False, message_id, body))
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(event_id, entry.sequence)  # moved: its message is stale

    def spend(
        self,
        event_id: str,
        at: datetime,
        message_id: str = "",
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """The event is acted on now: its moment is spent (its scheduled message cancelled; if
        it arrives all the same, it changes nothing)."""
        entry = self.read(event_id)
        if entry is not None and entry.fired and body is None:
            return
        base = entry or Pending(at, token(event_id, at), None, False, "", {})
        spent = Pending(
            base.at, base.token, None, True, message_id or base.message_id, body or base.body
        )
        self._write(event_id, spent)
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(event_id, entry.sequence)

    def drop(self, event_id: str) -> None:
        """The event ended: its moment goes, and its scheduled message."""
        record = self.records.read_event(event_id)
        if self.key not in record:
            return
        entry = pending(record, self.key)
        self.records.update_event(event_id, lambda r: without(r, self.key))
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(event_id, entry.sequence)

    def due(self, event_id: str, tok: str) -> Pending | str:
        """The entry to act on for a delivery of ``tok``, or why nothing is done."""
        entry = self.read(event_id)
        if entry is None or entry.token != tok:
            return "superseded"
        if entry.fired:
            return "fired already"
        return entry

    def fired(self, event_id: str, tok: str) -> None:
        self.records.update_event(event_id, lambda r: with_fired(r, tok, self.key))

    def _write(self, event_id: str, entry: Pending) -> None:
        self.records.update_event(event_id, lambda r: with_pending(r, event_id, entry, self.key))

    def _cancel(self, event_id: str, sequence: int) -> None:
        """Cancel a scheduled message; a failure is only logged (its token makes it a no-op)."""
        try:
            self.scheduler.cancel(sequence)
        except Exception as exc:  # noqa: BLE001 - stale when it arrives: its token says so
            log.warning(
                "scheduled %s %d of event %s not cancelled (%s): it changes nothing when it "
                "arrives",
                self.command,
                sequence,
                event_id,
                type(exc).__name__,
                extra={"eventId": event_id},
            )


def _newer(body: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """Whether the contract message ``body`` was observed no earlier than ``than``'s."""
    theirs, ours = than.get("time"), body.get("time")
    return not isinstance(theirs, str) or not isinstance(ours, str) or ours >= theirs
