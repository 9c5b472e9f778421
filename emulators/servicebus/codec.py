"""AMQP 1.0 message sections, split and re-assembled with proton.Data (no I/O).

The broker keeps the bare message (properties, application properties, body, footer) as the
client's exact bytes, so every body type (data, sequence, value; several sections) and every
property type round-trips untouched. It decodes only what it needs (header, annotations,
properties, application properties) and re-encodes header and message annotations, which it owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proton import Array, Data, Described, symbol, ubyte, uint, ulong

HEADER = 0x70
DELIVERY_ANNOTATIONS = 0x71
MESSAGE_ANNOTATIONS = 0x72
PROPERTIES = 0x73
APPLICATION_PROPERTIES = 0x74
DATA = 0x75
AMQP_SEQUENCE = 0x76
AMQP_VALUE = 0x77
FOOTER = 0x78
_SYMBOLIC = {
    "amqp:header:list": HEADER,
    "amqp:delivery-annotations:map": DELIVERY_ANNOTATIONS,
    "amqp:message-annotations:map": MESSAGE_ANNOTATIONS,
    "amqp:properties:list": PROPERTIES,
    "amqp:application-properties:map": APPLICATION_PROPERTIES,
    "amqp:data:binary": DATA,
    "amqp:amqp-sequence:list": AMQP_SEQUENCE,
    "amqp:value:*": AMQP_VALUE,
    "amqp:footer:map": FOOTER,
}
PROPERTY_FIELDS = (
    "message_id",
    "user_id",
    "to",
    "subject",
    "reply_to",
    "correlation_id",
    "content_type",
    "content_encoding",
    "absolute_expiry_time",
    "creation_time",
    "group_id",
    "group_sequence",
    "reply_to_group_id",
)


class MessageDecodeError(ValueError):
    """Bytes that are not an AMQP 1.0 message."""


@dataclass
class Sections:
    """One decoded message; the ``*_raw`` fields are the client's bytes, verbatim."""

    header: list[Any] = field(default_factory=lambda: [None] * 5)
    annotations: dict[Any, Any] = field(default_factory=dict)
    properties: list[Any] = field(default_factory=lambda: [None] * 13)
    application: dict[str, Any] = field(default_factory=dict)
    properties_raw: bytes = b""
    application_raw: bytes = b""
    body_raw: bytes = b""  # body sections and footer
    has_header: bool = False
    data_sections: list[bytes] = field(default_factory=list)
    other_body: bool = False  # a sequence or value body is present

    def prop(self, name: str) -> Any:
        return self.properties[PROPERTY_FIELDS.index(name)]


def owned(value: Any) -> Any:
    """``value`` with every memoryview copied to bytes.

    proton.Data hands out binary values as memoryviews into its own buffer, which the next
    decode (or the Data's release) overwrites; anything kept must own its bytes.
    """
    if isinstance(value, memoryview):
        return value.tobytes()
    if isinstance(value, dict):
        return type(value)((owned(k), owned(v)) for k, v in value.items())
    if isinstance(value, list):
        return [owned(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(owned(v) for v in value)
    if isinstance(value, Described):
        return Described(value.descriptor, owned(value.value))
    if isinstance(value, Array):
        return Array(value.descriptor, value.type, *(owned(v) for v in value.elements))
    return value


def _code(descriptor: Any) -> int:
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str) and descriptor in _SYMBOLIC:
        return _SYMBOLIC[descriptor]
    raise MessageDecodeError(f"unknown section descriptor {descriptor!r}")


def decode_sections(raw: bytes) -> Sections:
    """Split ``raw`` into sections; raise MessageDecodeError if it is not a message."""
    out = Sections()
    data = Data()
    view = memoryview(raw)
    offset = 0
    body_start: int | None = None
    while offset < len(raw):
        data.clear()
        try:
            used = data.decode(view[offset:].tobytes() if offset else raw)
        except Exception as exc:  # proton raises its own DataException family
            raise MessageDecodeError(f"undecodable section at byte {offset}: {exc}") from exc
        if used <= 0:
            raise MessageDecodeError(f"undecodable section at byte {offset}")
        data.rewind()
        data.next()
        section = data.get_object()
        if not isinstance(section, Described):
            raise MessageDecodeError(f"byte {offset}: a message section must be described")
        code = _code(section.descriptor)
        value = section.value if code in (DATA, AMQP_SEQUENCE, AMQP_VALUE) else owned(section.value)
        if code == HEADER:
            out.has_header = True
            out.header = (list(value or []) + [None] * 5)[:5]
        elif code == DELIVERY_ANNOTATIONS:
            pass  # per-hop, not stored
        elif code == MESSAGE_ANNOTATIONS:
            out.annotations = dict(value or {})
        elif code == PROPERTIES:
            out.properties = (list(value or []) + [None] * 13)[:13]
            out.properties_raw = raw[offset : offset + used]
        elif code == APPLICATION_PROPERTIES:
            out.application = {str(k): v for k, v in (value or {}).items()}
            out.application_raw = raw[offset : offset + used]
        else:
            if body_start is None:
                body_start = offset
            if code == DATA:
                out.data_sections.append(bytes(value))
            elif code in (AMQP_SEQUENCE, AMQP_VALUE):
                out.other_body = True
            elif code != FOOTER:
                raise MessageDecodeError(f"unknown section code {code:#x}")
        offset += used
    out.body_raw = raw[body_start:] if body_start is not None else b""
    return out


def split_batch(raw: bytes, sections: Sections) -> list[Sections] | None:
    """The messages inside an SDK batch envelope, or None if ``sections`` is one message.

    Proton's Python API does not expose a transfer's message-format (0x80013700 marks a batch),
    so a batch is recognised by its shape: the SDK's envelope has no header and no application
    properties, and every data section is itself a complete AMQP message; single messages from
    the SDK always carry a header.
    """
    if sections.has_header or sections.application or sections.other_body:
        return None
    if not sections.data_sections:
        return None
    inner: list[Sections] = []
    for chunk in sections.data_sections:
        if len(chunk) < 3 or chunk[0] != 0x00 or chunk[1] != 0x53 or not 0x70 <= chunk[2] <= 0x78:
            return None
        try:
            inner.append(decode_sections(chunk))
        except MessageDecodeError:
            return None
    return inner


def encode_application_properties(application: dict[str, Any]) -> bytes:
    data = Data()
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), application))
    return data.encode()


def encode_message(header: list[Any], annotations: dict[Any, Any], bare: bytes) -> bytes:
    """Header + message annotations (broker-owned) followed by the bare message bytes."""
    data = Data()
    durable, priority, ttl, first_acquirer, delivery_count = header
    data.put_object(
        Described(
            ulong(HEADER),
            [
                bool(durable) if durable is not None else None,
                ubyte(priority) if priority is not None else None,
                uint(ttl) if ttl is not None else None,
                bool(first_acquirer) if first_acquirer is not None else None,
                uint(delivery_count or 0),
            ],
        )
    )
    if annotations:
        data.put_object(Described(ulong(MESSAGE_ANNOTATIONS), annotations))
    return data.encode() + bare


def encode_value_message(
    value: Any, application: dict[str, Any], correlation_id: Any = None
) -> bytes:
    """A management/CBS response: properties(correlation-id), application properties, value."""
    data = Data()
    props: list[Any] = [None] * 13
    props[5] = correlation_id
    data.put_object(Described(ulong(PROPERTIES), props))
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), application))
    data.put_object(Described(ulong(AMQP_VALUE), value))
    return data.encode()


def decode_value_message(raw: bytes) -> tuple[Sections, Any]:
    """A management/CBS request: its sections and its amqp-value body (None if absent)."""
    sections = decode_sections(raw)
    value = None
    data = Data()
    offset = 0
    while offset < len(raw):
        data.clear()
        used = data.decode(raw[offset:])
        data.rewind()
        data.next()
        section = data.get_object()
        if isinstance(section, Described) and _code(section.descriptor) == AMQP_VALUE:
            value = owned(section.value)
        offset += used
    return sections, value


__all__ = [
    "PROPERTY_FIELDS",
    "MessageDecodeError",
    "Sections",
    "decode_sections",
    "decode_value_message",
    "encode_application_properties",
    "encode_message",
    "encode_value_message",
    "split_batch",
    "symbol",
]
