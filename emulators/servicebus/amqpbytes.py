"""AMQP 1.0 encoded values at the byte level: skip, read a few primitives, re-encode lists and maps.

proton.Data decodes whole values into Python objects; the emulator sometimes needs less (where a
value ends, one field of a performative) or something it cannot give (a map's entries as the
client's exact bytes, so one value can be changed and the rest kept). Pure functions, no I/O.
Every read is bounds-checked and raises AmqpBytesError on truncated or unknown encodings.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

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
