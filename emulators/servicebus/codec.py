"""AMQP 1.0 message sections, split and re-assembled with proton.Data (no I/O).

The broker keeps the bare message (properties, application properties, body, footer) as the
client's exact bytes, so every body type (data, sequence, value; several sections) and every
property type round-trips untouched. It decodes only what it needs (header, annotations,
properties, application properties) and re-encodes header and message annotations, which it owns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from proton import UNDESCRIBED, Array, Data, DataException, Described, symbol, ubyte, uint, ulong

from emulators.servicebus import amqpbytes
from emulators.servicebus.amqpbytes import AmqpBytesError, elements, encode_map, skip
from emulators.servicebus.decimals import DecimalError, application_properties

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


MAX_DEPTH = 64


def read_value(data: Data, depth: int = 0) -> Any:
    """The value at ``data``'s cursor as Python objects that own their bytes.

    Unlike ``Data.get_object`` this never fails on valid AMQP: binary values come back as
    bytes (proton's memoryviews would point into the Data's buffer and cannot be map keys),
    unhashable map keys (lists, maps) become tuples, and nesting is bounded.
    """
    if depth > MAX_DEPTH:
        raise MessageDecodeError(f"values nested deeper than {MAX_DEPTH}")
    kind = data.type()
    if kind == Data.MAP:
        count = data.get_map()
        result: dict[Any, Any] = {}
        data.enter()
        try:
            for _ in range(count // 2):
                data.next()
                key = _hashable(read_value(data, depth + 1))
                data.next()
                result[key] = read_value(data, depth + 1)
        finally:
            data.exit()
        return result
    if kind == Data.LIST:
        count = data.get_list()
        items: list[Any] = []
        data.enter()
        try:
            for _ in range(count):
                data.next()
                items.append(read_value(data, depth + 1))
        finally:
            data.exit()
        return items
    if kind == Data.ARRAY:
        count, described, element_type = data.get_array()
        data.enter()
        try:
            descriptor: Any = None
            if described:
                data.next()
                descriptor = read_value(data, depth + 1)
            elements = []
            for _ in range(count):
                data.next()
                elements.append(read_value(data, depth + 1))
        finally:
            data.exit()
        head: Any = descriptor if described else UNDESCRIBED
        return Array(head, cast(int, element_type), *elements)
    if kind == Data.DESCRIBED:
        data.enter()
        try:
            data.next()
            descriptor = read_value(data, depth + 1)
            data.next()
            value = read_value(data, depth + 1)
        finally:
            data.exit()
        return Described(descriptor, value)
    if kind == Data.BINARY:
        return bytes(data.get_binary())
    return data.get_object()


def _hashable(key: Any) -> Any:
    if isinstance(key, list):
        return tuple(_hashable(k) for k in key)
    if isinstance(key, dict):
        return tuple((_hashable(k), _hashable(v)) for k, v in key.items())
    try:
        hash(key)
    except TypeError as exc:
        raise MessageDecodeError(f"map key of type {type(key).__name__} is not supported") from exc
    return key


def decode_value(raw: bytes) -> tuple[Any, int]:
    """The first AMQP value in ``raw`` and the number of bytes it used (see ``_section`` for
    what proton refuses)."""
    data = Data()
    try:
        used = data.decode(raw)
    except DataException:
        try:
            return amqpbytes.decode(raw, 0)
        except amqpbytes.AmqpBytesError as exc:
            raise MessageDecodeError(f"undecodable value: {exc}") from exc
    if used <= 0:
        raise MessageDecodeError("undecodable value")
    data.rewind()
    data.next()
    return read_value(data), used


def _code(descriptor: Any) -> int:
    if isinstance(descriptor, int):
        return int(descriptor)
    if isinstance(descriptor, str) and descriptor in _SYMBOLIC:
        return _SYMBOLIC[descriptor]
    raise MessageDecodeError(f"unknown section descriptor {descriptor!r}")


def decode_sections(raw: bytes) -> Sections:
    """Split ``raw`` into sections; raise MessageDecodeError if it is not a message.

    Body sections (data, sequence, value) are only measured, never turned into Python
    objects: the broker keeps them as the client's bytes, whatever they hold.
    """
    out = Sections()
    view = memoryview(raw)
    offset = 0
    body_start: int | None = None
    while offset < len(raw):
        chunk = view[offset:].tobytes() if offset else bytes(raw)
        code, value, used = _section(chunk, offset)
        if code in (DATA, AMQP_SEQUENCE, AMQP_VALUE, FOOTER):
            if body_start is None:
                body_start = offset
            if code == DATA:
                if not isinstance(value, bytes):
                    raise MessageDecodeError(f"byte {offset}: a data section must hold binary")
                out.data_sections.append(value)
            elif code != FOOTER:
                out.other_body = True
        elif code == HEADER:
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
            out.application_raw = _servicebus_application(chunk, used, offset)
        else:
            raise MessageDecodeError(f"unknown section code {code:#x}")
        offset += used
    out.body_raw = raw[body_start:] if body_start is not None else b""
    return out


def _section(chunk: bytes, offset: int) -> tuple[int, Any, int]:
    """(section code, its value, bytes used) of the section at the start of ``chunk``.

    A sequence or value body is only measured (None): the broker keeps it as bytes. Proton
    decodes; what it refuses (valid AMQP it cannot hold, such as an array of nulls) goes
    through amqpbytes.decode, so the client gets an answer about the content instead.
    """
    data = Data()
    try:
        used = data.decode(chunk)
    except DataException:
        return _section_without_proton(chunk, offset)
    if used <= 0:
        raise MessageDecodeError(f"undecodable section at byte {offset}")
    data.rewind()
    data.next()
    if data.type() != Data.DESCRIBED:
        raise MessageDecodeError(f"byte {offset}: a message section must be described")
    data.enter()
    data.next()
    code = _code(read_value(data))
    data.next()
    if code in (AMQP_SEQUENCE, AMQP_VALUE, FOOTER):
        return code, None, used
    if code == DATA:
        if data.type() != Data.BINARY:
            raise MessageDecodeError(f"byte {offset}: a data section must hold binary")
        return code, bytes(data.get_binary()), used
    return code, read_value(data), used


def _section_without_proton(chunk: bytes, offset: int) -> tuple[int, Any, int]:
    try:
        if chunk[:1] != b"\x00":
            raise MessageDecodeError(f"byte {offset}: a message section must be described")
        descriptor, at = amqpbytes.decode(chunk, 1)
        code = _code(descriptor)
        if code in (AMQP_SEQUENCE, AMQP_VALUE, FOOTER):
            return code, None, amqpbytes.skip(chunk, at)
        value, end = amqpbytes.decode(chunk, at)
    except amqpbytes.AmqpBytesError as exc:
        raise MessageDecodeError(f"undecodable section at byte {offset}: {exc}") from exc
    return code, value, end


def _servicebus_application(chunk: bytes, used: int, offset: int) -> bytes:
    """The application-properties section as Service Bus delivers it (decimals re-encoded)."""
    section = chunk[:used]
    try:
        start = skip(section, 1)  # past 0x00 and the descriptor: the map follows
        converted = application_properties(section[start:])
    except (AmqpBytesError, DecimalError) as exc:
        raise MessageDecodeError(f"application properties at byte {offset}: {exc}") from exc
    return section if converted is None else section[:start] + converted


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
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), application))  # type: ignore[arg-type]
    return data.encode()


def _encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 256:
        return bytes([0xA1, len(raw)]) + raw
    return b"\xb1" + len(raw).to_bytes(4, "big") + raw


def with_application_properties(section: bytes, updates: dict[str, str]) -> bytes:
    """An application-properties section (as stored) with string entries set or replaced.

    Works on the bytes, so every other entry stays exactly as it is delivered.
    """
    if not section:
        return encode_application_properties(dict(updates))
    start = skip(section, 1)
    wanted = {_encode_string(k): _encode_string(v) for k, v in updates.items()}
    items: list[bytes] = []
    pending: bytes | None = None
    for index, (begin, end) in enumerate(elements(section, start)):
        item = section[begin:end]
        if index % 2 == 0:
            pending = item
            continue
        assert pending is not None
        if pending not in wanted:
            items += [pending, item]
    for key, value in wanted.items():
        items += [key, value]
    return section[:start] + encode_map(items)


def encode_message(
    header: list[Any],
    annotations: dict[Any, Any],
    bare: bytes,
    delivery_annotations: dict[Any, Any] | None = None,
) -> bytes:
    """Header, delivery and message annotations (broker-owned), then the bare message bytes."""
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
    if delivery_annotations is not None:
        data.put_object(Described(ulong(DELIVERY_ANNOTATIONS), delivery_annotations))
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
    data.put_object(Described(ulong(APPLICATION_PROPERTIES), cast(Any, application)))
    data.put_object(Described(ulong(AMQP_VALUE), value))
    return data.encode()


def decode_value_message(raw: bytes) -> tuple[Sections, Any]:
    """A management/CBS request: its sections and its amqp-value body (None if absent)."""
    sections = decode_sections(raw)
    value = None
    offset = 0
    while offset < len(raw):
        section, used = decode_value(raw[offset:])
        if isinstance(section, Described) and _code(section.descriptor) == AMQP_VALUE:
            value = section.value
        offset += used
    return sections, value


__all__ = [
    "PROPERTY_FIELDS",
    "MessageDecodeError",
    "Sections",
    "decode_sections",
    "decode_value",
    "decode_value_message",
    "encode_application_properties",
    "encode_message",
    "encode_value_message",
    "split_batch",
    "symbol",
    "with_application_properties",
]
