"""The drain moment of an event in its verified scope, kept durable (the pool store keeps the
JSON in the event's record, functions.shared.event_record; Service Bus keeps the scheduled
message: both through their ports, functions.shared.ports).

Capacity is lost from the moment a VM drains, so lb-pools drains an event at its **drain
moment** (sebridge.timing.drain_moment: NotBefore minus the event type's lead, at first sight
for short notices, Preempt and Terminate), not when it is first seen. A moment still ahead is
kept in two places:

- a message to lb-pools itself, scheduled on the ``drain-moments`` queue for that moment
  (Service Bus keeps it across restarts of the app; ``ScheduledEnqueueTimeUtc``), carrying only
  the event's id, its scope (the placement digest) and the moment's **token**;
- the event's record (``drainMoments``, under the event's scoped key): the moment, its token,
  the scheduled message's sequence number, and the newest contract message that asked for the
  drain (what is drained when it is due: verified again then, like a held event).

Moments are kept per verified scope, like everything else kept per event
(VerifiedMessage.scoped_key, functions.shared.verified): what one scope says of an EventId
(Scheduled, Updated, Cancelled, Started) moves, spends or drops only that scope's moment, and a
due message acts only on the moment of the scope it names, whose stored message must verify in
that same scope. Another set that knows (or forges) the EventId never moves, cancels or fires
this set's drain (issue 24 after issue 23).

An Updated that moves the moment schedules the new one and cancels the old (a new token); one
that leaves it keeps the scheduled message and only refreshes the message to drain. A Cancelled
or Completed drops the entry and cancels its message; a Started drains at once and does the
same. A redelivered Scheduled finds its token recorded with a sequence number and schedules
nothing. When a scheduled message arrives, it drains only if its token is the record's and the
moment has not fired yet: a stale or superseded delivery (a cancel that lost the race, a message
scheduled twice across a crash) changes nothing, so a moment fires once. The record is written
after the message is scheduled: a crash in between leaves at most a message whose token the
record may never name (a no-op when it arrives) and a redelivery schedules it again.

Schema 1 (before moments were scoped): the record kept one flat entry per EventId
(``drainMoment``, ``decideMoment``) and the due message named only the EventId. One still
scheduled when a deployment is upgraded is handled: it acts on the flat entry if its token is
still that entry's, and the stored message is verified again and acted on in its own verified
scope (:meth:`MomentBook.legacy_due`), unless that scope keeps a scoped moment by then. Any
scoped write of the event retires the flat entry (and cancels its message), as the old code
moved or dropped it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from functions.shared.event_record import MAX_SCOPES, event_of
from functions.shared.ports import MomentScheduler, PoolStore
from functions.shared.verified import Checked, UnverifiedMessage, VerifiedMessage
from sebridge.contract.events import ContractError, TransitionMessage, parse_message
from sebridge.imds import isoformat_utc
from sebridge.times import stored

log = logging.getLogger("sebridge.functions.moments")

KEY = "drainMoments"  # in the event's record, per scoped key: lb-pools' drain
DECIDE_KEY = "decideMoments"  # the gate's decision when a maintenance window opens
LEGACY_KEYS = {KEY: "drainMoment", DECIDE_KEY: "decideMoment"}  # schema 1: one per EventId
DUE_SCHEMA_VERSION = 2
LEGACY_SCHEMA_VERSION = 1
DUE_COMMAND = "drain-due"
DECIDE_COMMAND = "decide-due"
COMMANDS = {DUE_COMMAND: KEY, DECIDE_COMMAND: DECIDE_KEY}
MAX_DUE_BYTES = 1024
_HEX = frozenset("0123456789abcdef")


class DueError(ValueError):
    """A drain-moments message that is not one lb-pools scheduled (the message says why)."""


def token(key: str, at: datetime) -> str:
    """The moment's token (``key``: the event's scoped key): the same event in the same scope
    and moment give the same token; another scope's never does."""
    text = f"{key.strip().lower()}|{isoformat_utc(at)}"
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


def _entry(entry: object) -> Pending | None:
    if not isinstance(entry, Mapping):
        return None
    at = stored(entry.get("at"))
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


def pending(record: Mapping[str, Any], key: str, field: str = KEY) -> Pending | None:
    """The moment of the event in the scope ``key`` names (its scoped key) in ``field``
    (drain or decide), or None (none recorded, or unreadable)."""
    entries = record.get(field)
    return _entry(entries.get(key.lower())) if isinstance(entries, Mapping) else None


def legacy_pending(record: Mapping[str, Any], field: str = KEY) -> Pending | None:
    """The schema-1 flat entry of ``field`` (one per EventId, kept before moments were
    scoped), or None."""
    return _entry(record.get(LEGACY_KEYS[field]))


def with_pending(record: dict[str, Any], key: str, entry: Pending, field: str = KEY) -> bool:
    """Record ``entry`` as the moment of the event in the scope ``key`` names; whether that
    changed anything. At most MAX_SCOPES scopes per record (fired ones, then the earliest
    written, dropped first: their messages find nothing and change nothing)."""
    wanted = entry.to_json()
    entries = record.get(field)
    if not isinstance(entries, dict):
        entries = record[field] = {}
    if entries.get(key.lower()) == wanted:
        return False
    record.setdefault("eventId", event_of(key))
    entries.pop(key.lower(), None)
    entries[key.lower()] = wanted  # the newest last: insertion order is write order
    while len(entries) > MAX_SCOPES:
        fired = [k for k, v in entries.items() if isinstance(v, Mapping) and v.get("fired")]
        dropped = fired[0] if fired else next(iter(entries))
        log.warning("moments: dropped %s of more than %d scopes of one event", field, MAX_SCOPES)
        del entries[dropped]
    return True


def with_fired(record: dict[str, Any], key: str, tok: str, field: str = KEY) -> bool:
    """Mark the moment ``tok`` of the scope ``key`` fired (only if it is still the scope's)."""
    entry = pending(record, key, field)
    if entry is None or entry.token != tok or entry.fired:
        return False
    record[field][key.lower()] = {**record[field][key.lower()], "fired": True}
    return True


def without(record: dict[str, Any], key: str, field: str = KEY) -> bool:
    """Drop the moment of the event in the scope ``key`` names; whether there was one."""
    entries = record.get(field)
    if not isinstance(entries, dict) or entries.pop(key.lower(), None) is None:
        return False
    if not entries:
        del record[field]
    return True


def without_legacy(record: dict[str, Any], field: str = KEY) -> bool:
    """Drop the schema-1 flat entry of ``field``; whether there was one."""
    return record.pop(LEGACY_KEYS[field], None) is not None


def with_legacy_fired(record: dict[str, Any], tok: str, field: str = KEY) -> bool:
    """Mark the schema-1 flat entry ``tok`` fired (only if it is still the record's)."""
    entry = legacy_pending(record, field)
    if entry is None or entry.token != tok or entry.fired:
        return False
    name = LEGACY_KEYS[field]
    record[name] = {**record[name], "fired": True}
    return True


@dataclass(frozen=True)
class Due:
    """What a drain-moments message says: which command, which event in which scope (``key``,
    the scoped key; the bare EventId for a schema-1 message, ``legacy``), which moment."""

    command: str
    key: str
    token: str
    legacy: bool = False

    @property
    def event_id(self) -> str:
        return event_of(self.key)


def due_body(key: str, tok: str, command: str = DUE_COMMAND) -> bytes:
    """The scheduled message's body: which event in which scope (``key``, the scoped key, is
    sent as its EventId and placement digest), which moment. Nothing else is trusted from it:
    the scope's record says what to drain."""
    event_id, _, scope = key.strip().lower().rpartition(".")
    if event_of(key) == key:
        raise ValueError("a due message names the event's scoped key, not its EventId alone")
    return json.dumps(
        {
            "schemaVersion": DUE_SCHEMA_VERSION,
            "command": command,
            "eventId": event_id,
            "scope": scope,
            "token": tok,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def parse_due(body: bytes) -> Due:
    """What a drain-moments message says; :class:`DueError` if it is not one (``drain-due``:
    lb-pools drains; ``decide-due``: the gate decides again, a maintenance window opened).
    Schema 1 (no scope) is still read: see the module's docstring."""
    if len(body) > MAX_DUE_BYTES:
        raise DueError(f"larger than {MAX_DUE_BYTES} bytes")
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise DueError(f"not JSON: {exc}") from None
    if not isinstance(obj, Mapping):
        raise DueError("not a JSON object")
    command, version = obj.get("command"), obj.get("schemaVersion")
    if version not in (DUE_SCHEMA_VERSION, LEGACY_SCHEMA_VERSION) or command not in COMMANDS:
        raise DueError(
            f"not a {' or '.join(COMMANDS)} command of schema version {DUE_SCHEMA_VERSION}"
        )
    event_id, tok = obj.get("eventId"), obj.get("token")
    if not isinstance(event_id, str) or not 0 < len(event_id) <= 64 or "." in event_id:
        raise DueError("eventId is missing or not a short string")
    if not isinstance(tok, str) or not 0 < len(tok) <= 64:
        raise DueError("token is missing or not a short string")
    event_id = event_id.strip().lower()
    if version == LEGACY_SCHEMA_VERSION:
        return Due(str(command), event_id, tok, legacy=True)
    scope = obj.get("scope")
    if not isinstance(scope, str) or len(scope) != 16 or not set(scope) <= _HEX:
        raise DueError("scope is missing or not a placement digest")
    return Due(str(command), f"{event_id}.{scope}", tok)


@dataclass(frozen=True)
class MomentBook:
    """One kind of moment (``field`` in the event's record, ``command`` on the queue), kept per
    verified scope the way the module's docstring says: lb-pools' drains and the gate's
    decisions when a maintenance window opens both use it. Every ``key`` is an event's scoped
    key (VerifiedMessage.scoped_key); the record is the EventId's."""

    records: PoolStore
    scheduler: MomentScheduler
    field: str = KEY
    command: str = DUE_COMMAND

    def read(self, key: str) -> Pending | None:
        return pending(self.records.read_event(event_of(key)), key, self.field)

    def set(self, key: str, at: datetime, message_id: str, body: Mapping[str, Any]) -> None:
        """The scope's moment is ``at``, to act on ``body`` then: scheduled once (a moment
        already scheduled only gets the newer message), the one it replaces cancelled."""
        entry = self.read(key)
        tok = token(key, at)
        if entry is not None and entry.token == tok and entry.sequence is not None:
            if not entry.fired and _newer(body, entry.body):
                fresh = Pending(at, tok, entry.sequence, False, message_id, body)
                self._write(key, fresh)
            return
        sequence = self.scheduler.schedule(
            due_body(key, tok, self.command), at, f"{self.command}:{key}:{tok}"
        )
        self._write(key, Pending(at, tok, sequence, False, message_id, body))
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(key, entry.sequence)  # moved: its message is stale

    def spend(
        self,
        key: str,
        at: datetime,
        message_id: str = "",
        body: Mapping[str, Any] | None = None,
    ) -> None:
        """The scope's event is acted on now: its moment is spent (its scheduled message
        cancelled; if it arrives all the same, it changes nothing)."""
        entry = self.read(key)
        if entry is not None and entry.fired and body is None:
            return
        base = entry or Pending(at, token(key, at), None, False, "", {})
        spent = Pending(
            base.at, base.token, None, True, message_id or base.message_id, body or base.body
        )
        self._write(key, spent)
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(key, entry.sequence)

    def drop(self, key: str) -> None:
        """The scope's event ended: its moment goes, and its scheduled message."""
        record = self.records.read_event(event_of(key))
        if self.field not in record and LEGACY_KEYS[self.field] not in record:
            return
        entry = pending(record, key, self.field)
        self._change(key, lambda r: without(r, key, self.field))
        if entry is not None and entry.sequence is not None and not entry.fired:
            self._cancel(key, entry.sequence)

    def due(self, key: str, tok: str) -> Pending | str:
        """The scope's entry to act on for a delivery of ``tok``, or why nothing is done."""
        entry = self.read(key)
        if entry is None:
            return "no moment in its scope"
        if entry.token != tok:
            return "superseded"
        if entry.fired:
            return "fired already"
        return entry

    def fired(self, key: str, tok: str) -> None:
        self.records.update_event(event_of(key), lambda r: with_fired(r, key, tok, self.field))

    def take(
        self, due: Due, verify: Callable[[TransitionMessage], Checked]
    ) -> VerifiedMessage | str:
        """A scheduled message arrived: the stored contract message to act on, verified again
        (``verify``: the seal and scope check) and in the scope the message names; or why
        nothing is done (logged; a moment that cannot be acted on is spent, :meth:`done`).
        A schema-1 message acts in its stored message's verified scope, unless that scope
        keeps a scoped moment (which supersedes it)."""
        entry = (
            self.legacy_due(due.event_id, due.token) if due.legacy else self.due(due.key, due.token)
        )
        if isinstance(entry, str):
            return self._skip(due, entry)
        try:
            message = parse_message(
                json.dumps(dict(entry.body), separators=(",", ":")).encode("utf-8"),
                entry.message_id,
            )
        except ContractError as exc:
            self.done(due)
            return self._skip(due, f"its stored message is unreadable: {exc}", logging.ERROR)
        checked = verify(message)
        if isinstance(checked, UnverifiedMessage):
            self.done(due)
            return self._skip(due, f"its stored message is refused: {checked.reason}")
        if due.legacy and self.read(checked.scoped_key) is not None:
            self.done(due)
            return self._skip(due, "superseded by its scope's own moment (schema 1)")
        if not due.legacy and checked.scoped_key != due.key:
            self.done(due)
            return self._skip(due, "its stored message verifies in another scope", logging.ERROR)
        return checked

    def done(self, due: Due) -> None:
        """The moment ``due`` names is spent (acted on, or never to be)."""
        if due.legacy:
            self.legacy_fired(due.event_id, due.token)
        else:
            self.fired(due.key, due.token)

    def _skip(self, due: Due, reason: str, level: int = logging.INFO) -> str:
        log.log(
            level,
            "scheduled %s of event %s not acted on: %s",
            self.command,
            due.key,
            reason,
            extra={"eventId": due.event_id, "reason": reason},
        )
        return reason

    # ---- schema 1: one flat entry per EventId, from before moments were scoped --------------
    def legacy_due(self, event_id: str, tok: str) -> Pending | str:
        """The flat entry to act on for a schema-1 delivery of ``tok``, or why nothing is done
        (the caller verifies its stored message and acts in that scope, unless the scope keeps
        a scoped moment: :meth:`read`)."""
        entry = legacy_pending(self.records.read_event(event_id), self.field)
        if entry is None or entry.token != tok:
            return "superseded (a schema-1 moment its event no longer keeps)"
        if entry.fired:
            return "fired already"
        return entry

    def legacy_fired(self, event_id: str, tok: str) -> None:
        self.records.update_event(event_id, lambda r: with_legacy_fired(r, tok, self.field))

    def drop_legacy(self, event_id: str) -> None:
        self.records.update_event(event_id, lambda r: without_legacy(r, self.field))

    def _write(self, key: str, entry: Pending) -> None:
        self._change(key, lambda r: with_pending(r, key, entry, self.field))

    def _change(self, key: str, edit: Callable[[dict[str, Any]], bool]) -> None:
        """Apply ``edit`` to the event's record; the event is kept per scope from now on, so
        its schema-1 flat entry goes in the same write (and its message is cancelled), as the
        old code moved or dropped it on the event's next message."""
        retired: list[Pending | None] = []

        def change(record: dict[str, Any]) -> bool:
            old = legacy_pending(record, self.field)
            had = without_legacy(record, self.field)
            retired[:] = [old] if had else []
            changed = edit(record)
            return changed or had

        self.records.update_event(event_of(key), change)
        for old in retired:
            if old is not None and old.sequence is not None and not old.fired:
                self._cancel(key, old.sequence)

    def _cancel(self, key: str, sequence: int) -> None:
        """Cancel a scheduled message; a failure is only logged (its token makes it a no-op)."""
        try:
            self.scheduler.cancel(sequence)
        except Exception as exc:  # noqa: BLE001 - stale when it arrives: its token says so
            log.warning(
                "scheduled %s %d of event %s not cancelled (%s): it changes nothing when it "
                "arrives",
                self.command,
                sequence,
                key,
                type(exc).__name__,
                extra={"eventId": key},
            )


def _newer(body: Mapping[str, Any], than: Mapping[str, Any]) -> bool:
    """Whether the contract message ``body`` was observed no earlier than ``than``'s."""
    theirs, ours = than.get("time"), body.get("time")
    return not isinstance(theirs, str) or not isinstance(ours, str) or ours >= theirs
