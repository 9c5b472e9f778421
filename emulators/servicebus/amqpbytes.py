"""AMQP 1.0 encoded values at the byte level: skip, read a few primitives, re-encode lists and maps.

proton.Data decodes whole values into Python objects; the emulator sometimes needs less (where a
value ends, one field of a performative) or something it cannot give (a map's entries as the
client's exact bytes, so one value can be changed and the rest kept). Pure functions, no I/O.
Every read is bounds-checked and raises AmqpBytesError on truncated or unknown encodings.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

from proton import (
    UNDESCRIBED,
    Array,
    Data,
    Described,
    byte,
    char,
    decimal32,
    decimal64,
    decimal128,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

DESCRIBED = 0x00
NULL = 0x40
TRUE = 0x41
FALSE = 0x42
UINT0 = 0x43
ULONG0 = 0x44
LIST0 = 0x45
BOOLEAN = 0x56
SMALLUINT = 0x52
SMALLULONG = 0x53
UINT = 0x70
ULONG = 0x80
DECIMAL32 = 0x74
DECIMAL64 = 0x84
DECIMAL128 = 0x94
LIST8 = 0xC0
MAP8 = 0xC1
LIST32 = 0xD0
MAP32 = 0xD1
MAX_DEPTH = 64

# width of the fixed part after the constructor, by the constructor's high nibble
_FIXED = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
# width of the size prefix of variable and compound encodings, by high nibble
_SIZED = {0xA: 1, 0xB: 4, 0xC: 1, 0xD: 4, 0xE: 1, 0xF: 4}


class AmqpBytesError(ValueError):
    """Bytes that are not a well-formed AMQP value."""


def _need(buf: bytes | memoryview, pos: int, count: int) -> None:
    if pos < 0 or pos + count > len(buf):
        raise AmqpBytesError(f"truncated value: need {count} bytes at {pos}, have {len(buf)}")


def skip(buf: bytes | memoryview, pos: int, depth: int = 0) -> int:
    """The offset just past the value that starts at ``pos``."""
    if depth > MAX_DEPTH:
        raise AmqpBytesError(f"values nested deeper than {MAX_DEPTH}")
    _need(buf, pos, 1)
    code = buf[pos]
    if code == DESCRIBED:
        return skip(buf, skip(buf, pos + 1, depth + 1), depth + 1)
    nibble = code >> 4
    if nibble in _FIXED:
        width = _FIXED[nibble]
        _need(buf, pos + 1, width)
        return pos + 1 + width
    if nibble in _SIZED:
        prefix = _SIZED[nibble]
        _need(buf, pos + 1, prefix)
        size = buf[pos + 1] if prefix == 1 else struct.unpack_from(">I", buf, pos + 1)[0]
        end = pos + 1 + prefix + size
        _need(buf, pos, end - pos)
        return end
    raise AmqpBytesError(f"unknown constructor {code:#04x} at byte {pos}")


def compound(buf: bytes | memoryview, pos: int) -> tuple[int, int, int]:
    """(first element offset, element count, end offset) of the list or map at ``pos``."""
    _need(buf, pos, 1)
    code = buf[pos]
    if code == LIST0:
        return pos + 1, 0, pos + 1
    if code in (LIST8, MAP8):
        _need(buf, pos + 1, 2)
        size, count = buf[pos + 1], buf[pos + 2]
        end = pos + 2 + size
        _need(buf, pos, end - pos)
        return pos + 3, count, end
    if code in (LIST32, MAP32):
        _need(buf, pos + 1, 8)
        size, count = struct.unpack_from(">II", buf, pos + 1)
        end = pos + 5 + size
        _need(buf, pos, end - pos)
        return pos + 9, count, end
    raise AmqpBytesError(f"expected a list or map at byte {pos}, found {code:#04x}")


def elements(buf: bytes | memoryview, pos: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each element of the list or map at ``pos`` (a map yields key, value...)."""
    at, count, end = compound(buf, pos)
    for _ in range(count):
        stop = skip(buf, at)
        if stop > end:
            raise AmqpBytesError(f"element at byte {at} runs past its container")
        yield at, stop
        at = stop


def read_uint(buf: bytes | memoryview, pos: int) -> int | None:
    """A uint or ulong (any of their encodings) at ``pos``; None for null."""
    _need(buf, pos, 1)
    code = buf[pos]
    if code == NULL:
        return None
    if code in (UINT0, ULONG0):
        return 0
    if code in (SMALLUINT, SMALLULONG, 0x50):
        _need(buf, pos + 1, 1)
        return int(buf[pos + 1])
    if code == 0x60:
        _need(buf, pos + 1, 2)
        return int(struct.unpack_from(">H", buf, pos + 1)[0])
    if code == UINT:
        _need(buf, pos + 1, 4)
        return int(struct.unpack_from(">I", buf, pos + 1)[0])
    if code == ULONG:
        _need(buf, pos + 1, 8)
        return int(struct.unpack_from(">Q", buf, pos + 1)[0])
    raise AmqpBytesError(f"expected an unsigned integer at byte {pos}, found {code:#04x}")


def read_bool(buf: bytes | memoryview, pos: int) -> bool | None:
    _need(buf, pos, 1)
    code = buf[pos]
    if code == NULL:
        return None
    if code in (TRUE, FALSE):
        return code == TRUE
    if code == BOOLEAN:
        _need(buf, pos + 1, 1)
        return buf[pos + 1] != 0
    raise AmqpBytesError(f"expected a boolean at byte {pos}, found {code:#04x}")


def descriptor_code(buf: bytes | memoryview, pos: int) -> tuple[int | None, int]:
    """(numeric descriptor or None for a symbolic one, offset of the described value)."""
    _need(buf, pos, 1)
    if buf[pos] != DESCRIBED:
        raise AmqpBytesError(f"expected a described value at byte {pos}")
    code = buf[pos + 1] if pos + 1 < len(buf) else None
    after = skip(buf, pos + 1)
    if code in (SMALLULONG, ULONG, ULONG0):
        return read_uint(buf, pos + 1), after
    return None, after


def encode_uint(value: int) -> bytes:
    return bytes([UINT]) + struct.pack(">I", value & 0xFFFFFFFF)


def encode_list(items: list[bytes]) -> bytes:
    """A list32 of already-encoded elements."""
    body = b"".join(items)
    return bytes([LIST32]) + struct.pack(">II", len(body) + 4, len(items)) + body


def encode_map(items: list[bytes]) -> bytes:
    """A map32 of already-encoded keys and values (alternating)."""
    body = b"".join(items)
    return bytes([MAP32]) + struct.pack(">II", len(body) + 4, len(items)) + body


# -- a complete decoder, for values proton.Data refuses (e.g. an array of nulls) ----------------
def decode(buf: bytes | memoryview, pos: int = 0, depth: int = 0) -> tuple[Any, int]:
    """(value, end offset) of the value at ``pos``, as the Python objects proton.Data gives.

    Used where Proton's decoder gives up on valid AMQP that azure-servicebus sends (an array
    whose element constructor is null: ``[None]`` lock tokens).
    """
    if depth > MAX_DEPTH:
        raise AmqpBytesError(f"values nested deeper than {MAX_DEPTH}")
    _need(buf, pos, 1)
    code = buf[pos]
    if code == DESCRIBED:
        descriptor, at = decode(buf, pos + 1, depth + 1)
        value, end = decode(buf, at, depth + 1)
        return Described(descriptor, value), end
    end = skip(buf, pos, depth)
    return _decode_body(buf, code, pos + 1, end, depth), end


def _decode_body(buf: bytes | memoryview, code: int, at: int, end: int, depth: int) -> Any:
    data = bytes(buf[at:end])
    if code == NULL:
        return None
    if code in (TRUE, FALSE):
        return code == TRUE
    if code in _SCALARS:
        kind, fmt = _SCALARS[code]
        return kind(struct.unpack(fmt, data)[0]) if fmt else kind(data[0])
    if code in (UINT0, ULONG0):
        return uint(0) if code == UINT0 else ulong(0)
    if code in (0xA0, 0xB0):
        return data[1:] if code == 0xA0 else data[4:]
    if code in (0xA1, 0xB1):
        return (data[1:] if code == 0xA1 else data[4:]).decode("utf-8")
    if code in (0xA3, 0xB3):
        return symbol((data[1:] if code == 0xA3 else data[4:]).decode("ascii"))
    if code in (LIST0, LIST8, LIST32):
        return [decode(buf, a, depth + 1)[0] for a, _b in elements(buf, at - 1)]
    if code in (MAP8, MAP32):
        items = [decode(buf, a, depth + 1)[0] for a, _b in elements(buf, at - 1)]
        return {_key(items[i]): items[i + 1] for i in range(0, len(items) - 1, 2)}
    if code in (0xE0, 0xF0):
        return _array(buf, code, at, depth)
    raise AmqpBytesError(f"unsupported constructor {code:#04x}")


def _array(buf: bytes | memoryview, code: int, at: int, depth: int) -> Array:
    if code == 0xE0:
        count, pos = buf[at + 1], at + 2
    else:
        count, pos = struct.unpack_from(">I", buf, at + 4)[0], at + 8
    descriptor: Any = UNDESCRIBED
    if buf[pos] == DESCRIBED:
        descriptor, pos = decode(buf, pos + 1, depth + 1)
    element = buf[pos]
    pos += 1
    values: list[Any] = []
    for _ in range(count):
        # each element is the constructor's body without the constructor byte
        probe = bytes([element]) + bytes(buf[pos : pos + _body_width(buf, element, pos)])
        value, used = decode(probe, 0, depth + 1)
        values.append(value)
        pos += used - 1
    return Array(descriptor, _ARRAY_TYPES.get(element, Data.NULL), *values)


def _body_width(buf: bytes | memoryview, code: int, pos: int) -> int:
    nibble = code >> 4
    if nibble in _FIXED:
        return _FIXED[nibble]
    prefix = _SIZED.get(nibble)
    if prefix is None:
        raise AmqpBytesError(f"unknown array element constructor {code:#04x}")
    _need(buf, pos, prefix)
    size = buf[pos] if prefix == 1 else struct.unpack_from(">I", buf, pos)[0]
    return int(prefix + size)


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


_SCALARS: dict[int, tuple[Any, str]] = {
    0x50: (ubyte, ""),
    0x51: (byte, ">b"),
    0x52: (uint, ""),
    0x53: (ulong, ""),
    0x54: (int32, ">b"),
    0x55: (int, ">b"),
    0x56: (bool, ""),
    0x60: (ushort, ">H"),
    0x61: (short, ">h"),
    0x70: (uint, ">I"),
    0x71: (int32, ">i"),
    0x72: (float32, ">f"),
    0x73: (lambda n: char(chr(n)), ">I"),
    0x74: (decimal32, ">I"),
    0x80: (ulong, ">Q"),
    0x81: (int, ">q"),
    0x82: (float, ">d"),
    0x83: (timestamp, ">q"),
    0x84: (decimal64, ">Q"),
    0x94: (lambda b: decimal128(b), "16s"),
    0x98: (lambda b: uuid.UUID(bytes=b), "16s"),
}
_ARRAY_TYPES = {
    NULL: Data.NULL,
    0x56: Data.BOOL,
    0x41: Data.BOOL,
    0x42: Data.BOOL,
    0x50: Data.UBYTE,
    0x51: Data.BYTE,
    0x60: Data.USHORT,
    0x61: Data.SHORT,
    0x43: Data.UINT,
    0x52: Data.UINT,
    0x70: Data.UINT,
    0x54: Data.INT,
    0x71: Data.INT,
    0x44: Data.ULONG,
    0x53: Data.ULONG,
    0x80: Data.ULONG,
    0x55: Data.LONG,
    0x81: Data.LONG,
    0x72: Data.FLOAT,
    0x82: Data.DOUBLE,
    0x73: Data.CHAR,
    0x83: Data.TIMESTAMP,
    0x98: Data.UUID,
    0xA0: Data.BINARY,
    0xB0: Data.BINARY,
    0xA1: Data.STRING,
    0xB1: Data.STRING,
    0xA3: Data.SYMBOL,
    0xB3: Data.SYMBOL,
    0xC0: Data.LIST,
    0xD0: Data.LIST,
    0xC1: Data.MAP,
    0xD1: Data.MAP,
}
