"""CloudEvents 1.0 in the structured JSON format: a small builder and a reader (pure).

The contract needs four required attributes (``specversion``, ``id``, ``source``, ``type``),
four optional ones (``subject``, ``time``, ``datacontenttype``, ``dataschema``) and ``data`` as
a JSON value: a dict in, a dict out. Reading checks every attribute's type, so a body whose
``type`` is a number, or whose ``time`` is not an RFC 3339 timestamp, is refused with a reason
instead of failing somewhere later (https://github.com/cloudevents/spec, ``json-format.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sebridge.times import readable

SPEC_VERSION = "1.0"
REQUIRED = ("specversion", "id", "source", "type")
OPTIONAL_STRINGS = ("subject", "datacontenttype", "dataschema")
MAX_ATTRIBUTE_LENGTH = 4096


class CloudEventError(ValueError):
    """The document is not a CloudEvents 1.0 structured JSON event."""


@dataclass(frozen=True)
class CloudEvent:
    id: str
    source: str
    type: str
    data: Any
    subject: str | None = None
    time: datetime | None = None
    datacontenttype: str | None = "application/json"
    dataschema: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "specversion": SPEC_VERSION,
            "id": self.id,
            "source": self.source,
            "type": self.type,
        }
        if self.subject is not None:
            body["subject"] = self.subject
        if self.time is not None:
            body["time"] = format_time(self.time)
        if self.datacontenttype is not None:
            body["datacontenttype"] = self.datacontenttype
        if self.dataschema is not None:
            body["dataschema"] = self.dataschema
        body["data"] = self.data
        return body

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], *, warnings: list[str] | None = None) -> CloudEvent:
        """Strict by default. With ``warnings`` (a list), tolerant about the optional
        attributes: one of the wrong type, or a ``time`` that is not an RFC 3339 timestamp, is
        dropped and named there; the required ones stay strict either way."""
        for name in REQUIRED:
            value = obj.get(name)
            if not isinstance(value, str) or not value:
                raise CloudEventError(f"attribute {name!r} is missing or not a non-empty string")
            if len(value) > MAX_ATTRIBUTE_LENGTH:
                raise CloudEventError(f"attribute {name!r} is longer than {MAX_ATTRIBUTE_LENGTH}")
        if obj["specversion"] != SPEC_VERSION:
            raise CloudEventError(f"specversion {obj['specversion']!r} is not {SPEC_VERSION}")
        if "data_base64" in obj:
            raise CloudEventError("binary data (data_base64) is not part of this contract")

        def odd(problem: str) -> None:
            if warnings is None:
                raise CloudEventError(problem)
            warnings.append(f"{problem}: dropped")

        optional: dict[str, str | None] = {}
        for name in OPTIONAL_STRINGS:
            value = obj.get(name)
            if value is not None and not isinstance(value, str):
                odd(f"attribute {name!r} is not a string")
                value = None
            optional[name] = value
        time_text = obj.get("time")
        moment: datetime | None = None
        if time_text is not None:
            if not isinstance(time_text, str):
                odd("attribute 'time' is not a string")
            else:
                try:
                    moment = parse_time(time_text)
                except CloudEventError as exc:
                    odd(str(exc))
        return cls(
            id=obj["id"],
            source=obj["source"],
            type=obj["type"],
            data=obj.get("data"),
            subject=optional["subject"],
            time=moment,
            datacontenttype=optional["datacontenttype"],
            dataschema=optional["dataschema"],
        )


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with ``Z``: ``2026-11-22T01:20:00Z`` (microseconds only when set)."""
    if moment.tzinfo is None:
        raise ValueError("a CloudEvent time must be timezone-aware")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """An RFC 3339 timestamp to an aware UTC datetime; :class:`CloudEventError` otherwise."""
    if len(text) > 64 or "T" not in text.upper():
        raise CloudEventError(f"time {text[:64]!r} is not an RFC 3339 timestamp")
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError as exc:
        raise CloudEventError(f"time {text[:64]!r} is not an RFC 3339 timestamp") from exc
    if moment.tzinfo is None:
        raise CloudEventError(f"time {text[:64]!r} has no offset")
    inside = readable(moment)  # the kernel's one range of times (sebridge.times)
    if inside is None:
        raise CloudEventError(f"time {text[:64]!r} is out of range (1970 to 9000)")
    return inside
