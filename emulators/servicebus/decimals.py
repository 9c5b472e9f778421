"""AMQP decimal application properties, re-encoded the way Service Bus re-encodes them.

Service Bus does not keep a message's application properties as the client's bytes: it parses
them into .NET values and encodes them again on delivery. For decimals that round trip is lossy
and not IEEE 754: the service reads a decimal32/64/128 into a System.Decimal (96-bit coefficient,
scale 0..28; Microsoft.ServiceBus.Messaging.Amqp.Encoding.DecimalEncoding) and writes it back as
a decimal128 whose exponent is split ``exponent >> 9`` / ``(exponent & 0x7F) << 1`` over the
first two bytes. azure-servicebus decodes exactly that layout (its decoder shifts by 9 too), and
fails on the IEEE encoding it sends itself, so a message that kept the client's bytes could not
be received. Values the service cannot parse (scale over 28, coefficient overflow) are refused.
"""

from __future__ import annotations

import struct

from emulators.servicebus import amqpbytes

DECIMAL32_BIAS = 101
DECIMAL64_BIAS = 398
DECIMAL128_BIAS = 6176
MAX_SCALE = 28
MAX_COEFFICIENT = 2**96 - 1
_WIDTH = {amqpbytes.DECIMAL32: 4, amqpbytes.DECIMAL64: 8, amqpbytes.DECIMAL128: 16}


class DecimalError(ValueError):
    """A decimal Service Bus could not turn into a System.Decimal."""


def _create(coefficient: int, negative: bool, exponent: int) -> tuple[int, bool, int]:
    """(coefficient, negative, scale) as DecimalEncoding.CreateDecimal makes them."""
    if exponent <= 0:
        scale = (-exponent) & 0xFF  # C#: (byte)-exponent
        if scale > MAX_SCALE:
            raise DecimalError(f"scale {scale} is outside a System.Decimal's 0..28")
        return coefficient, negative, scale
    value = coefficient * 10**exponent
    if value > MAX_COEFFICIENT:
        raise DecimalError("the value overflows a System.Decimal")
    return value, negative, 0


def parse(code: int, value: bytes) -> tuple[int, bool, int]:
    """(coefficient, negative, scale) of a decimal's value bytes, read as the service reads it."""
    b = bytearray(value)
    negative = bool(b[0] & 0x80)
    exponent = 0
    if code == amqpbytes.DECIMAL128:
        if b[0] & 0x60 != 0x60:
            exponent = ((b[0] & 0x7F) << 7) | ((b[1] & 0xFE) >> 1)
        elif b[0] & 0x78 == 0:
            return 0, False, 0  # "out of the valid range already": the service makes it 0
        high, middle, low = struct.unpack_from(">III", b, 4)
        return _create((high << 64) | (middle << 32) | low, negative, exponent - DECIMAL128_BIAS)
    if code == amqpbytes.DECIMAL64:
        if b[0] & 0x60 != 0x60:
            exponent = ((b[0] & 0x7F) << 3) | ((b[1] & 0xE0) >> 5)
            b[0] = 0
            b[1] &= 0x1F
        elif b[0] & 0x78 == 0:
            exponent = ((b[0] & 0x1F) << 8) | ((b[1] & 0xF8) >> 3)
            b[0] = 0
            b[1] = (b[1] & 0x07) | 0x20
        middle, low = struct.unpack_from(">II", b, 0)
        return _create((middle << 32) | low, negative, exponent - DECIMAL64_BIAS)
    if code == amqpbytes.DECIMAL32:
        if b[0] & 0x60 != 0x60:
            exponent = ((b[0] & 0x7F) << 1) | ((b[1] & 0x80) >> 7)
            b[0] = 0
            b[1] &= 0x7F
        elif b[0] & 0x78 == 0:
            exponent = ((b[0] & 0x1F) << 3) | ((b[1] & 0xE0) >> 5)
            b[0] = 0
            b[1] = (b[1] & 0x1F) | 0x80
        (low,) = struct.unpack_from(">I", b, 0)
        return _create(low, negative, exponent - DECIMAL32_BIAS)
    raise DecimalError(f"not a decimal constructor: {code:#04x}")


def encode(coefficient: int, negative: bool, scale: int) -> bytes:
    """The decimal128 (constructor included) the service writes for a System.Decimal."""
    exponent = DECIMAL128_BIAS - scale
    first = (0x80 if negative else 0) | ((exponent >> 9) & 0xFF)
    second = ((exponent & 0x7F) << 1) & 0xFF
    words = struct.pack(
        ">III", coefficient >> 64, (coefficient >> 32) & 0xFFFFFFFF, coefficient & 0xFFFFFFFF
    )
    return bytes([amqpbytes.DECIMAL128, first, second, 0, 0]) + words


def as_servicebus(encoded: bytes) -> bytes:
    """One encoded decimal value (constructor included), re-encoded as Service Bus delivers it."""
    code = encoded[0]
    width = _WIDTH.get(code)
    if width is None or len(encoded) != 1 + width:
        raise DecimalError(f"not an encoded decimal: {encoded[:1].hex()} of {len(encoded)} bytes")
    return encode(*parse(code, encoded[1:]))


def application_properties(section_value: bytes) -> bytes | None:
    """The application-properties map with every decimal value re-encoded, or None if it has none.

    ``section_value`` is the map's encoding (after the section descriptor). Other entries keep
    the client's bytes. Raises DecimalError naming the property when one cannot be converted.
    """
    if not any(code in section_value for code in _WIDTH):
        return None  # fast path: no decimal constructor byte anywhere
    items: list[bytes] = []
    changed = False
    key = b""
    for index, (start, end) in enumerate(amqpbytes.elements(section_value, 0)):
        item = bytes(section_value[start:end])
        if index % 2 == 0:
            key = item
        elif item[0] in _WIDTH:
            try:
                item = as_servicebus(item)
            except DecimalError as exc:
                name = key[2:].decode("utf-8", "replace") if key[:1] == b"\xa1" else key.hex()
                raise DecimalError(f"application property {name!r}: {exc}") from exc
            changed = True
        items.append(item)
    return amqpbytes.encode_map(items) if changed else None
