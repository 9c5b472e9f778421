"""Approval command contract v1 on the ``approvals`` queue: the single source for both sides.

``{"schemaVersion": 1, "command": "approve", "eventId", "requestedBy", "reason", "expiresAt"}``
sent with ``session_id`` = the target VM's name (IMDS compute.name) and
``message_id`` = ``approve:<EventId>``. The JSON Schema is ``schemas/approval-command.v1.json``.

:func:`parse_command` never raises anything but :class:`CommandError`, whose ``reason`` is the
dead-letter reason the forwarder uses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

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

    @property
    def message_id(self) -> str:
        return f"approve:{self.event_id}"

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
    """A GUID in any case or brace form, as the lower-case hyphenated string."""
    if not isinstance(value, str):
        raise CommandError(INVALID_EVENT_ID, "eventId is not a string")
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError as exc:
        raise CommandError(INVALID_EVENT_ID, f"eventId {value[:64]!r} is not a GUID") from exc


def _text(obj: Mapping[str, Any], key: str, *, required: bool) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value.strip()):
        raise CommandError(INVALID_FIELD, f"{key} must be a non-empty string")
    if len(value) > MAX_TEXT:
        raise CommandError(INVALID_FIELD, f"{key} is longer than {MAX_TEXT} characters")
    if any(ord(ch) < 32 and ch not in "\t" for ch in value):
        raise CommandError(INVALID_FIELD, f"{key} contains control characters")
    return value.strip()


def _expiry(value: object) -> datetime:
    if not isinstance(value, str):
        raise CommandError(INVALID_FIELD, "expiresAt must be an ISO 8601 string")
    try:
        moment = datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise CommandError(INVALID_FIELD, f"expiresAt {value[:64]!r} is not ISO 8601") from exc
    if moment.tzinfo is None:
        raise CommandError(INVALID_FIELD, "expiresAt must carry a time zone (use Z for UTC)")
    return moment.astimezone(UTC)


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
