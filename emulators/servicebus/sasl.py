"""The SASL layer for plain-TCP connections: ANONYMOUS and PLAIN.

Proton's built-in SASL (this build has no Cyrus) offers only ANONYMOUS and EXTERNAL to
clients, so the emulator runs the SASL exchange itself on accepted sockets and hands the
socket to the Proton reactor once the outcome is sent. The frame codec is pure; ``handshake``
does blocking I/O on one socket with a timeout.

PLAIN takes the SAS key name as user name and the key as password (``auth.check_plain``).
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import Any, Protocol, cast

from proton import UNDESCRIBED, Array, Data, Described, symbol, ubyte, ulong

from emulators.servicebus.auth import SasPolicy, check_plain
from emulators.servicebus.codec import MessageDecodeError, decode_value

LOG = logging.getLogger("sebridge.servicebus_emulator.sasl")

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
MECHANISMS = ("ANONYMOUS", "PLAIN")
SASL_MECHANISMS = 0x40
SASL_INIT = 0x41
SASL_OUTCOME = 0x44
OK, AUTH_FAILED, SYSTEM_ERROR = 0, 1, 2
MAX_SASL_FRAME = 64 * 1024


class SaslError(Exception):
    """The peer broke the SASL exchange."""


@dataclass(frozen=True)
class SaslResult:
    """How a connection authenticated: ``sasl`` False means it skipped SASL altogether."""

    sasl: bool
    mechanism: str | None = None
    user: str | None = None
    authenticated: bool = False  # PLAIN with the right key name and key


def encode_frame(code: int, fields: list[Any]) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), fields))
    body = data.encode()
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def decode_frame(frame: bytes) -> tuple[int, list[Any]]:
    """(performative code, fields) of one SASL frame including its 8-byte header."""
    if len(frame) < 8:
        raise SaslError("short SASL frame")
    size, doff, kind, _channel = struct.unpack(">IBBH", frame[:8])
    if kind != 1 or size != len(frame) or doff < 2:
        raise SaslError(f"not a SASL frame (type {kind}, size {size}, doff {doff})")
    try:
        value, _used = decode_value(frame[doff * 4 :])
    except MessageDecodeError as exc:
        raise SaslError(f"undecodable SASL frame: {exc}") from exc
    if not isinstance(value, Described) or not isinstance(value.value, list | None):
        raise SaslError("SASL frame body is not a described list")
    descriptor: Any = value.descriptor
    if not isinstance(descriptor, int):
        raise SaslError(f"SASL frame descriptor {descriptor!r} is not numeric")
    return int(descriptor), list(value.value or [])


def mechanisms_frame() -> bytes:
    return encode_frame(
        SASL_MECHANISMS,
        [Array(cast(Any, UNDESCRIBED), Data.SYMBOL, *(symbol(m) for m in MECHANISMS))],
    )


def outcome_frame(code: int) -> bytes:
    return encode_frame(SASL_OUTCOME, [ubyte(code)])


def judge_init(fields: list[Any], policy: SasPolicy | None) -> tuple[int, SaslResult]:
    """The outcome code for a sasl-init and what it established."""
    mechanism = str(fields[0]) if fields else ""
    response = bytes(fields[1]) if len(fields) > 1 and fields[1] is not None else b""
    if mechanism == "ANONYMOUS":
        return OK, SaslResult(True, mechanism, None, policy is None)
    if mechanism == "PLAIN":
        parts = response.split(b"\x00")
        if len(parts) != 3:
            return AUTH_FAILED, SaslResult(True, mechanism)
        user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        if check_plain(user, password, policy):
            return OK, SaslResult(True, mechanism, user, True)
        return AUTH_FAILED, SaslResult(True, mechanism, user)
    return AUTH_FAILED, SaslResult(True, mechanism)


class ByteStream(Protocol):
    """What the exchange reads from and writes to (bridge.ClientStream: the client's socket
    through its TLS and WebSocket layers)."""

    def recv_exact(self, count: int) -> bytes: ...

    def sendall(self, data: bytes) -> None: ...


def handshake(stream: ByteStream, policy: SasPolicy | None) -> tuple[SaslResult, bytes] | None:
    """Run the exchange on a blocking stream (with a timeout set by the caller).

    Returns what was established and the bytes already read that belong to the AMQP layer
    (the AMQP header when the client skipped SASL), or None when the connection is refused.
    Reads never go past the SASL frames, so a client pipelining its AMQP header is fine.
    """
    header = stream.recv_exact(8)
    if header == AMQP_HEADER:
        return SaslResult(False, authenticated=policy is None), header
    if header != SASL_HEADER:
        stream.sendall(SASL_HEADER)
        LOG.info("refusing connection: unknown protocol header %r", header)
        return None
    stream.sendall(SASL_HEADER + mechanisms_frame())
    size = struct.unpack(">I", stream.recv_exact(4))[0]
    if not 8 <= size <= MAX_SASL_FRAME:
        raise SaslError(f"SASL frame size {size} out of range")
    code, fields = decode_frame(struct.pack(">I", size) + stream.recv_exact(size - 4))
    if code != SASL_INIT:
        raise SaslError(f"expected sasl-init, got performative {code:#x}")
    outcome, result = judge_init(fields, policy)
    stream.sendall(outcome_frame(outcome))
    if outcome != OK:
        LOG.info("SASL %s refused for user %r", result.mechanism, result.user)
        return None
    return result, b""
