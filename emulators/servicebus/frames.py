"""AMQP frames between a client and Proton: renumber out-of-order delivery-ids (pure, no I/O).

azure-servicebus's pure-Python AMQP stack assigns a session's delivery-ids and writes the
transfer frames without a lock, so transfers sent from several threads at once (AutoLockRenewer
with several workers, concurrent settlement or peeks) reach the broker out of order or with a
repeated delivery-id. Service Bus accepts them; Proton closes the connection ("sequencing error,
expected delivery-id 2, got 1"). This rewriter sits between the client and Proton:

* client -> broker: each new delivery on a session gets the next delivery-id Proton expects
  (counting from the begin frame's next-outgoing-id); when that differs from the client's, the
  transfer is rewritten and the pair remembered;
* broker -> client: dispositions of the client's deliveries (role=receiver) are mapped back to
  the client's own delivery-ids, split into several frames when the ids are not contiguous;
* frames the client sends on a channel after ending its session (the SDK detaches links after
  ``end`` when it closes) are dropped instead of failing the connection.

Anything it cannot parse passes through untouched (Proton then answers it as before).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

from emulators.servicebus import amqpbytes

LOG = logging.getLogger("sebridge.servicebus_emulator.frames")

PROTOCOL_HEADER_SIZE = 8
FRAME_HEADER_SIZE = 8
AMQP_FRAME = 0
BEGIN = 0x11
TRANSFER = 0x14
DISPOSITION = 0x15
END = 0x17
MAX_FRAME = 64 * 1024 * 1024  # larger "frames" are not ours to judge: passthrough
MAX_MAPPED = 100_000  # renumbered deliveries remembered per session until settled
U32 = 0xFFFFFFFF


@dataclass
class _Session:
    next_id: int  # the delivery-id Proton expects next
    partial: dict[int, int] = field(default_factory=dict)  # handle -> id of an unfinished delivery
    mapped: dict[int, int] = field(default_factory=dict)  # our id -> the client's id
    renumbered: int = 0


class _Splitter:
    """Cuts a byte stream into the protocol header and then whole frames."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.header_left = PROTOCOL_HEADER_SIZE
        self.passthrough = False

    def feed(self, data: bytes, on_frame: Callable[[bytes], bytes]) -> bytes:
        if self.passthrough:
            return data
        self.buffer += data
        out: list[bytes] = []
        while True:
            if self.header_left:
                if len(self.buffer) < self.header_left:
                    break
                out.append(bytes(self.buffer[: self.header_left]))
                del self.buffer[: self.header_left]
                self.header_left = 0
                continue
            if len(self.buffer) < FRAME_HEADER_SIZE:
                break
            size = struct.unpack_from(">I", self.buffer, 0)[0]
            doff = self.buffer[4]
            if size < FRAME_HEADER_SIZE or size > MAX_FRAME or doff < 2 or doff * 4 > size:
                # not a frame we understand: hand everything over as it is from now on
                self.passthrough = True
                out.append(bytes(self.buffer))
                self.buffer.clear()
                break
            if len(self.buffer) < size:
                break
            frame = bytes(self.buffer[:size])
            del self.buffer[:size]
            out.append(on_frame(frame))
        return b"".join(out)


def _performative(frame: bytes) -> tuple[int, int, int] | None:
    """(performative code, offset of its field list, channel), or None for other frames."""
    if frame[5] != AMQP_FRAME:
        return None
    body = frame[4] * 4
    if body >= len(frame):
        return None  # an empty (heartbeat) frame
    code, list_at = amqpbytes.descriptor_code(frame, body)
    if code is None:
        return None
    return code, list_at, struct.unpack_from(">H", frame, 6)[0]


def _fields(frame: bytes, list_at: int) -> tuple[list[bytes], int]:
    """The encoded fields of the performative list at ``list_at`` and where the list ends."""
    _first, _count, end = amqpbytes.compound(frame, list_at)
    return [frame[a:b] for a, b in amqpbytes.elements(frame, list_at)], end


def _rebuild(frame: bytes, list_at: int, list_end: int, fields: list[bytes]) -> bytes:
    """``frame`` with its performative's list replaced (payload and extended header kept)."""
    out = frame[FRAME_HEADER_SIZE:list_at] + amqpbytes.encode_list(fields) + frame[list_end:]
    return struct.pack(">I", FRAME_HEADER_SIZE + len(out)) + frame[4:FRAME_HEADER_SIZE] + out


def _uint(field_bytes: bytes) -> int | None:
    return amqpbytes.read_uint(field_bytes, 0)


def _bool(field_bytes: bytes) -> bool:
    return bool(amqpbytes.read_bool(field_bytes, 0))


class FrameRewriter:
    """One connection's rewriting state; ``from_client`` and ``from_broker`` take raw bytes."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._client = _Splitter()
        self._broker = _Splitter()
        self._sessions: dict[int, _Session] = {}  # by the client's channel
        self._broker_channels: dict[int, int] = {}  # broker channel -> client channel
        self._ended: set[int] = set()  # client channels whose session the client ended
        self.renumbered = 0

    # -- client -> broker ----------------------------------------------------------------------
    def from_client(self, data: bytes) -> bytes:
        return self._client.feed(data, self._client_frame)

    def _client_frame(self, frame: bytes) -> bytes:
        return self._performative_frame(frame, "client ->", self._client_performative)

    def _client_performative(self, frame: bytes, code: int, list_at: int, channel: int) -> bytes:
        if channel in self._ended and code != BEGIN:
            # azure-servicebus detaches links after ending their session when it closes;
            # Proton would fail the connection with "no such channel" (Service Bus does not)
            LOG.debug("%s: dropped %#04x on ended channel %s", self.name, code, channel)
            return b""
        if code == BEGIN:
            fields, _end = _fields(frame, list_at)
            next_id = _uint(fields[1]) if len(fields) > 1 else None
            self._sessions[channel] = _Session(next_id or 0)
            self._ended.discard(channel)
        elif code == END:
            self._sessions.pop(channel, None)
            self._ended.add(channel)
        elif code == TRANSFER:
            return self._transfer(frame, list_at, channel)
        return frame

    def _performative_frame(
        self,
        frame: bytes,
        direction: str,
        handle: Callable[[bytes, int, int, int], bytes],
    ) -> bytes:
        """``handle(frame, code, list_at, channel)`` for a performative frame, else ``frame``;
        a frame that cannot be parsed goes through as it is (Proton answers it)."""
        try:
            parsed = _performative(frame)
            if parsed is None:
                return frame
            code, list_at, channel = parsed
            if LOG.isEnabledFor(logging.DEBUG):
                LOG.debug("%s: %s %#04x on channel %s", self.name, direction, code, channel)
            return handle(frame, code, list_at, channel)
        except amqpbytes.AmqpBytesError as exc:
            LOG.debug("%s: %s frame left as it is (%s)", self.name, direction, exc)
            return frame

    def _transfer(self, frame: bytes, list_at: int, channel: int) -> bytes:
        session = self._sessions.get(channel)
        if session is None:
            return frame  # no begin seen: Proton will answer it
        fields, list_end = _fields(frame, list_at)
        if not fields:
            return frame
        handle = _uint(fields[0])
        if handle is None:
            return frame
        client_id = _uint(fields[1]) if len(fields) > 1 else None
        settled = _bool(fields[4]) if len(fields) > 4 else False
        more = _bool(fields[5]) if len(fields) > 5 else False
        aborted = _bool(fields[8]) if len(fields) > 8 else False
        ours = session.partial.get(handle)
        if ours is None:  # the first frame of a new delivery
            if client_id is None:
                return frame  # invalid: Proton will say so
            ours = session.next_id
            session.next_id = (session.next_id + 1) & U32
            if client_id != ours and not settled:
                session.mapped[ours] = client_id
                while len(session.mapped) > MAX_MAPPED:
                    del session.mapped[next(iter(session.mapped))]
        if more and not aborted:
            session.partial[handle] = ours
        else:
            session.partial.pop(handle, None)
        if client_id is None or client_id == ours:
            return frame
        if session.renumbered == 0:
            LOG.info(
                "%s: client delivery-ids out of sequence on channel %s (got %s, next is %s); "
                "renumbering them as Service Bus tolerates them",
                self.name,
                channel,
                client_id,
                ours,
            )
        session.renumbered += 1
        self.renumbered += 1
        fields[1] = amqpbytes.encode_uint(ours)
        return _rebuild(frame, list_at, list_end, fields)

    # -- broker -> client ----------------------------------------------------------------------
    def from_broker(self, data: bytes) -> bytes:
        return self._broker.feed(data, self._broker_frame)

    def _broker_frame(self, frame: bytes) -> bytes:
        return self._performative_frame(frame, "broker ->", self._broker_performative)

    def _broker_performative(self, frame: bytes, code: int, list_at: int, channel: int) -> bytes:
        if code == BEGIN:
            fields, _end = _fields(frame, list_at)
            remote = _uint(fields[0]) if fields else None
            if remote is not None:
                self._broker_channels[channel] = remote
        elif code == END:
            self._broker_channels.pop(channel, None)
        elif code == DISPOSITION:
            return self._disposition(frame, list_at, channel)
        return frame

    def _disposition(self, frame: bytes, list_at: int, channel: int) -> bytes:
        client_channel = self._broker_channels.get(channel)
        session = None if client_channel is None else self._sessions.get(client_channel)
        if session is None or not session.mapped:
            return frame
        fields, list_end = _fields(frame, list_at)
        if len(fields) < 2 or not _bool(fields[0]):
            return frame  # role=sender: about our own deliveries
        first = _uint(fields[1])
        if first is None:
            return frame
        last = _uint(fields[2]) if len(fields) > 2 else None
        count = (((last if last is not None else first) - first) & U32) + 1
        ours = [(first + i) & U32 for i in range(min(count, MAX_MAPPED))]
        if not any(i in session.mapped for i in ours):
            return frame
        settled = _bool(fields[3]) if len(fields) > 3 else False
        theirs = [session.mapped.get(i, i) for i in ours]
        if settled:
            for i in ours:
                session.mapped.pop(i, None)
        while len(fields) < 3:
            fields.append(bytes([amqpbytes.NULL]))
        frames: list[bytes] = []
        run_start = run_end = theirs[0]
        for client_id in [*theirs[1:], None]:
            if client_id is not None and client_id == (run_end + 1) & U32:
                run_end = client_id
                continue
            fields[1] = amqpbytes.encode_uint(run_start)
            fields[2] = amqpbytes.encode_uint(run_end)
            frames.append(_rebuild(frame, list_at, list_end, list(fields)))
            if client_id is not None:
                run_start = run_end = client_id
        return b"".join(frames)
