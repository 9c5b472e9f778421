"""AMQP over WebSockets, server side (RFC 6455, subprotocol AMQPWSB10): pure, no I/O.

Service Bus serves it on ``wss://<namespace>:443/$servicebus/websocket``; azure-servicebus's
pure-Python transport (``TransportType.AmqpOverWebsocket``, the websocket-client package) opens
``ws[s]://<host>[:<port>]/$servicebus/websocket`` with subprotocol ``AMQPWSB10`` and then speaks
plain AMQP (SASL included) inside binary messages, split across frames as it likes.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from dataclasses import dataclass

SUBPROTOCOL = "AMQPWSB10"
PATH = "/$servicebus/websocket"
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_REQUEST = 16 * 1024
MAX_PAYLOAD = 64 * 1024 * 1024
CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
NORMAL_CLOSURE, PROTOCOL_ERROR, UNSUPPORTED_DATA, TOO_BIG = 1000, 1002, 1003, 1009


class WebSocketError(ValueError):
    """A handshake or frame that breaks RFC 6455 (``code`` is the close code to send)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Upgrade:
    path: str
    key: str
    protocols: tuple[str, ...]


def parse_upgrade(request: bytes) -> Upgrade:
    """The upgrade request (everything up to and including the blank line)."""
    try:
        text = request.decode("latin-1")
    except UnicodeDecodeError as exc:  # pragma: no cover - latin-1 decodes every byte
        raise WebSocketError(f"undecodable request: {exc}") from exc
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
        raise WebSocketError(f"not a GET request: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise WebSocketError(f"malformed header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if "websocket" not in headers.get("upgrade", "").lower():
        raise WebSocketError("missing 'Upgrade: websocket'")
    if "upgrade" not in headers.get("connection", "").lower():
        raise WebSocketError("missing 'Connection: Upgrade'")
    if headers.get("sec-websocket-version") != "13":
        raise WebSocketError("Sec-WebSocket-Version must be 13")
    key = headers.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            raise ValueError("not 16 bytes")
    except ValueError as exc:
        raise WebSocketError(f"bad Sec-WebSocket-Key {key!r}: {exc}") from exc
    protocols = tuple(
        p.strip() for p in headers.get("sec-websocket-protocol", "").split(",") if p.strip()
    )
    return Upgrade(parts[1], key, protocols)


def accept_key(key: str) -> str:
    digest = hashlib.sha1((key + GUID).encode("ascii"), usedforsecurity=False).digest()
    return base64.b64encode(digest).decode("ascii")


def switching_protocols(upgrade: Upgrade) -> bytes:
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(upgrade.key)}\r\n"
        f"Sec-WebSocket-Protocol: {SUBPROTOCOL}\r\n\r\n"
    ).encode("ascii")


def http_error(status: int, reason: str, detail: str) -> bytes:
    body = (detail + "\n").encode("utf-8")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode("ascii") + body


def encode_frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked frame (servers never mask)."""
    head = bytes([0x80 | opcode])
    size = len(payload)
    if size < 126:
        head += bytes([size])
    elif size < 1 << 16:
        head += bytes([126]) + struct.pack(">H", size)
    else:
        head += bytes([127]) + struct.pack(">Q", size)
    return head + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return encode_frame(CLOSE, struct.pack(">H", code) + reason.encode("utf-8")[:120])


class FrameDecoder:
    """Client frames in, the binary payload stream and control frames out."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._in_message = False
        self.closed = False

    def feed(self, data: bytes) -> tuple[bytes, list[tuple[int, bytes]]]:
        """(binary payload bytes, control frames as (opcode, payload)) decoded so far."""
        self._buffer += data
        payload: list[bytes] = []
        control: list[tuple[int, bytes]] = []
        while not self.closed:
            frame = self._next()
            if frame is None:
                break
            fin, opcode, body = frame
            if opcode >= CLOSE:
                if not fin or len(body) > 125:
                    raise WebSocketError("fragmented or oversized control frame")
                if opcode not in (CLOSE, PING, PONG):
                    raise WebSocketError(f"unknown control opcode {opcode:#x}")
                control.append((opcode, body))
                if opcode == CLOSE:
                    self.closed = True
                continue
            if opcode == TEXT:
                raise WebSocketError("AMQP travels in binary messages", UNSUPPORTED_DATA)
            if opcode == BINARY:
                if self._in_message:
                    raise WebSocketError("a new message started inside a fragmented one")
            elif opcode == CONTINUATION:
                if not self._in_message:
                    raise WebSocketError("continuation frame without a message")
            else:
                raise WebSocketError(f"unknown opcode {opcode:#x}")
            self._in_message = not fin
            payload.append(body)
        return b"".join(payload), control

    def _next(self) -> tuple[bool, int, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        first, second = buf[0], buf[1]
        if first & 0x70:
            raise WebSocketError("reserved bits set (no extension was negotiated)")
        if not second & 0x80:
            raise WebSocketError("client frames must be masked")
        size = second & 0x7F
        at = 2
        if size == 126:
            if len(buf) < 4:
                return None
            size = struct.unpack_from(">H", buf, 2)[0]
            at = 4
        elif size == 127:
            if len(buf) < 10:
                return None
            size = struct.unpack_from(">Q", buf, 2)[0]
            at = 10
        if size > MAX_PAYLOAD:
            raise WebSocketError(f"frame of {size} bytes is over {MAX_PAYLOAD}", TOO_BIG)
        if len(buf) < at + 4 + size:
            return None
        mask = bytes(buf[at : at + 4])
        body = _unmask(bytes(buf[at + 4 : at + 4 + size]), mask)
        del buf[: at + 4 + size]
        return bool(first & 0x80), first & 0x0F, body


def _unmask(data: bytes, mask: bytes) -> bytes:
    if not data:
        return data
    repeated = (mask * (len(data) // 4 + 1))[: len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        len(data), "big"
    )
