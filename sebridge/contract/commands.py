"""Approval command contract v1 on the ``approvals`` queue: the single source for both sides.

``{"schemaVersion": 1, "command": "approve", "eventId", "requestedBy", "reason", "expiresAt"}``
sent with ``session_id`` = the target VM's name (IMDS compute.name) and
``message_id`` = ``approve:<EventId>``. The JSON Schema is ``schemas/approval-command.v1.json``
and the parser is exactly as strict as it (tests/unit/test_contract.py holds both to a table of
tricky bodies): eventId is a canonical 8-4-4-4-12 hex GUID in any case (no braces, no
``urn:uuid:``, no surrounding spaces); expiresAt is an RFC 3339 date-time with seconds and
``Z`` or an offset (``2026-11-22T02:00:00Z``, ``...02:00:00.5+01:00``; no leap second).

:func:`parse_command` never raises anything but :class:`CommandError`, whose ``reason`` is the
dead-letter reason the forwarder uses.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from sebridge.contract.tracecontext import TraceContext, for_message
from sebridge.imds import isoformat_utc

SCHEMA_VERSION = 1
APPROVE = "approve"
MAX_TEXT = 512  # requestedBy and reason end up in logs, cards and messages: keep them short

# Dead-letter reasons, one per class of invalid command.
INVALID_JSON = "InvalidJson"
UNSUPPORTED_SCHEMA_VERSION = "UnsupportedSchemaVersion"
UNKNOWN_COMMAND = "UnknownCommand"
INVALID_FIELD = "InvalidField"
INVALID_EVENT_ID = "InvalidEventId"
EXPIRED = "CommandExpired"
EVENT_NOT_FOUND = "EventNotFound"
NOT_LISTED = "VmNotInResources"
IMDS_REJECTED = "ImdsRejected"

# The shapes the schema's patterns allow (ASCII digits, whole string); the calendar, the clock
# and offset ranges are checked by building the datetime, as the patterns spell them out.
_GUID = re.compile(r"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}")
_DATE_TIME = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(Z|([+-])([0-9]{2}):([0-9]{2}))"
)


class CommandError(ValueError):
    def __init__(self, reason: str, description: str) -> None:
        super().__init__(f"{reason}: {description}")
        self.reason = reason
        self.description = description


@dataclass(frozen=True)
class ApproveCommand:
    event_id: str  # lower-case canonical GUID
    requested_by: str
    reason: str
    expires_at: datetime
    # Not in the body: the sender's span, carried as the ``traceparent`` application property
    # (None: the event's trace with a span named by the message id, see :meth:`trace_context`).
    trace: TraceContext | None = None

    @property
    def message_id(self) -> str:
        return f"approve:{self.event_id}"

    def trace_context(self) -> TraceContext:
        """The context the command message carries: always the event's trace."""
        return self.trace or for_message(self.event_id, self.message_id)

    def to_body(self) -> dict[str, Any]:
        return {
            "schemaVersion": SCHEMA_VERSION,
            "command": APPROVE,
            "eventId": self.event_id,
            "requestedBy": self.requested_by,
            "reason": self.reason,
            "expiresAt": isoformat_utc(self.expires_at),
        }

    def body_bytes(self) -> bytes:
        return json.dumps(self.to_body(), separators=(",", ":")).encode("utf-8")


def canonical_event_id(value: object) -> str:
    """A GUID as 8-4-4-4-12 hex digits in any case, returned in lower case."""
    if not isinstance(value, str):
        raise CommandError(INVALID_EVENT_ID, "eventId is not a string")
    if not _GUID.fullmatch(value):
        raise CommandError(
            INVALID_EVENT_ID,
            f"eventId {value[:64]!r} is not a GUID written 8-4-4-4-12 (no braces or prefix)",
        )
    return value.lower()


def _text(obj: Mapping[str, Any], key: str, *, required: bool) -> str:
    if key not in obj and not required:
        return ""
    value = obj.get(key)
    if not isinstance(value, str) or (required and not value.strip()):
        raise CommandError(INVALID_FIELD, f"{key} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise CommandError(INVALID_FIELD, f"{key} is longer than {MAX_TEXT} characters")
    if any(ord(ch) < 32 and ch not in "\t" for ch in value):
        raise CommandError(INVALID_FIELD, f"{key} contains control characters")
    return value.strip()


def _expiry(value: object) -> datetime:
    """RFC 3339 date-time with seconds and Z or an offset, as an aware UTC datetime."""
    shape = "an RFC 3339 date-time like 2026-11-22T02:00:00Z (seconds and Z or +hh:mm required)"
    if not isinstance(value, str):
        raise CommandError(INVALID_FIELD, f"expiresAt must be {shape}")
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise CommandError(INVALID_FIELD, f"expiresAt {value[:64]!r} is not {shape}")
    year, month, day, hour, minute, second, fraction, zone, sign, zh, zm = match.groups()
    try:
        if zone == "Z":
            offset = UTC
        elif int(zh) > 23 or int(zm) > 59:
            raise ValueError("offset out of range")
        else:
            delta = timedelta(hours=int(zh), minutes=int(zm))
            offset = timezone(-delta if sign == "-" else delta)
        micro = int((fraction or "0")[:6].ljust(6, "0"))  # finer digits are dropped
        moment = datetime(
            int(year), int(month), int(day), int(hour), int(minute), int(second), micro, offset
        )
    except ValueError as exc:
        raise CommandError(INVALID_FIELD, f"expiresAt {value[:64]!r}: {exc}") from exc
    try:
        return moment.astimezone(UTC)
    except OverflowError:  # within a day of year 1 or 9999: as early or late as a UTC time gets
        return (datetime.min if moment.year == 1 else datetime.max).replace(tzinfo=UTC)


def parse_command(body: bytes | str | Mapping[str, Any], now: datetime) -> ApproveCommand:
    """Validate one command body; raises :class:`CommandError` with the dead-letter reason."""
    if isinstance(body, Mapping):
        obj: Any = body
    else:
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise CommandError(INVALID_JSON, f"body is not JSON: {exc}") from exc
    if not isinstance(obj, Mapping):
        raise CommandError(INVALID_JSON, "body is not a JSON object")
    version = obj.get("schemaVersion")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise CommandError(
            UNSUPPORTED_SCHEMA_VERSION, f"schemaVersion {version!r} is not {SCHEMA_VERSION}"
        )
    command = obj.get("command")
    if command != APPROVE:
        shown = command[:64] if isinstance(command, str) else command
        raise CommandError(UNKNOWN_COMMAND, f"command {shown!r} is not {APPROVE!r}")
    event_id = canonical_event_id(obj.get("eventId"))
    requested_by = _text(obj, "requestedBy", required=True)
    reason = _text(obj, "reason", required=False)
    expires_at = _expiry(obj.get("expiresAt"))
    if expires_at <= now:
        raise CommandError(EXPIRED, f"expiresAt {isoformat_utc(expires_at)} is in the past")
    return ApproveCommand(
        event_id=event_id, requested_by=requested_by, reason=reason, expires_at=expires_at
    )


def approve_command(
    event_id: str, requested_by: str, reason: str, expires_at: datetime
) -> ApproveCommand:
    """Build a command, applying the same rules a receiver applies."""
    return ApproveCommand(
        event_id=canonical_event_id(event_id),
        requested_by=_text({"requestedBy": requested_by}, "requestedBy", required=True),
        reason=_text({"reason": reason}, "reason", required=False),
        expires_at=expires_at.astimezone(UTC),
    )
