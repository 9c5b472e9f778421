"""One accepted connection, from the client's socket to the Proton reactor.

Every connection gets a thread that owns the client socket. It runs, in turn:

1. TLS (amqps and wss listeners; Python's ssl module over memory BIOs, so one thread does
   reads and writes without the socket-level SSL object's threading caveats);
2. the WebSocket upgrade (ws and wss listeners: path ``/$servicebus/websocket``, subprotocol
   ``AMQPWSB10``), after which AMQP travels in binary WebSocket messages;
3. the SASL exchange (sasl.py: ANONYMOUS, PLAIN);
4. the pump: AMQP bytes both ways between the client and one end of a socket pair whose other
   end the reactor reads, through frames.FrameRewriter (delivery-ids the client sent out of
   order are renumbered, and mapped back in dispositions).

Proton therefore only ever talks to a local socket pair: a client that vanishes is noticed
here (logged at INFO, never as an ERROR), and Proton's end is shut down in an orderly way.
Each phase is bounded: handshakes by a socket timeout, the pump by the stop flag (checked every
POLL seconds) and a WIND_DOWN deadline once either side has closed.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from emulators.servicebus import websocket
from emulators.servicebus.auth import SasPolicy
from emulators.servicebus.frames import FrameRewriter
from emulators.servicebus.polling import select_by_poll
from emulators.servicebus.sasl import SaslError, SaslResult, handshake

LOG = logging.getLogger("sebridge.servicebus_emulator")

HANDSHAKE_TIMEOUT = 10.0
POLL = 0.5
WIND_DOWN = 5.0  # once one side closed: how long the other may still take to finish
HIGH_WATER = 4 * 1024 * 1024  # stop reading a side while this much waits to be written
CHUNK = 256 * 1024


@dataclass(frozen=True)
class Listener:
    """A listening socket and how its connections arrive: amqp, amqps, ws or wss."""

    sock: socket.socket
    scheme: str

    @property
    def tls(self) -> bool:
        return self.scheme in ("amqps", "wss")

    @property
    def websocket(self) -> bool:
        return self.scheme in ("ws", "wss")

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def url(self, host: str) -> str:
        shown = host if ":" not in host else f"[{host}]"
        path = websocket.PATH if self.websocket else ""
        return f"{self.scheme}://{shown}:{self.port}{path}"


class StreamClosed(ConnectionError):
    """The client closed the connection (or said goodbye at the TLS/WebSocket layer)."""


class ClientStream:
    """The client's bytes through TLS and WebSocket framing, either optional.

    ``open``, ``recv_exact`` and ``sendall`` block (socket timeout) and serve the handshakes;
    ``incoming``/``outgoing`` transform bytes for the non-blocking pump.
    """

    def __init__(
        self, sock: socket.socket, tls: ssl.SSLContext | None, use_websocket: bool
    ) -> None:
        self.sock = sock
        self._incoming_bio = ssl.MemoryBIO()
        self._outgoing_bio = ssl.MemoryBIO()
        self._tls = (
            None
            if tls is None
            else tls.wrap_bio(self._incoming_bio, self._outgoing_bio, server_side=True)
        )
        self._ws = websocket.FrameDecoder() if use_websocket else None
        self._layer = bytearray()  # decrypted bytes before WebSocket decoding (upgrade only)
        self._app = bytearray()  # AMQP bytes read but not yet consumed
        self.outbox = bytearray()  # raw bytes the transformations owe the client
        self.closed = False
        self._said_goodbye = False

    # -- blocking phase ------------------------------------------------------------------------
    def open(self) -> None:
        if self._tls is not None:
            while True:
                try:
                    self._tls.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    self._flush()
                    self._incoming_bio.write(self._recv_raw())
            self._flush()
        if self._ws is not None:
            self._upgrade()

    def _recv_raw(self) -> bytes:
        data = self.sock.recv(CHUNK)
        if not data:
            raise StreamClosed("client closed the connection")
        return data

    def _read_decrypted(self) -> bytes:
        """Decrypted bytes: what TLS already holds (data that came with the handshake's last
        record) first, else the next read from the socket."""
        if self._tls is not None:
            held = self._decrypt(b"")
            if held:
                return held
        return self._decrypt(self._recv_raw())

    def _flush(self) -> None:
        pending = bytes(self.outbox) + self._outgoing_bio.read()
        self.outbox.clear()
        if pending:
            self.sock.sendall(pending)

    def _upgrade(self) -> None:
        while b"\r\n\r\n" not in self._layer:
            if len(self._layer) > websocket.MAX_REQUEST:
                self._refuse_upgrade(431, "Request Header Fields Too Large", "request too large")
            self._layer += self._read_decrypted()
        end = self._layer.index(b"\r\n\r\n") + 4
        request, rest = bytes(self._layer[:end]), bytes(self._layer[end:])
        self._layer.clear()
        try:
            upgrade = websocket.parse_upgrade(request)
        except websocket.WebSocketError as exc:
            self._refuse_upgrade(400, "Bad Request", str(exc))
        if upgrade.path.split("?", 1)[0] != websocket.PATH:
            self._refuse_upgrade(404, "Not Found", f"AMQP over WebSockets is at {websocket.PATH}")
        if websocket.SUBPROTOCOL not in upgrade.protocols:
            self._refuse_upgrade(
                400, "Bad Request", f"Sec-WebSocket-Protocol must offer {websocket.SUBPROTOCOL}"
            )
        self.sock.sendall(self._encrypt(websocket.switching_protocols(upgrade)))
        if rest:
            self._app += self._unframe(rest)

    def _refuse_upgrade(self, status: int, reason: str, detail: str) -> NoReturn:
        LOG.info("WebSocket upgrade refused (%s %s): %s", status, reason, detail)
        self.sock.sendall(self._encrypt(websocket.http_error(status, reason, detail)))
        raise StreamClosed(f"WebSocket upgrade refused: {detail}")

    def recv_exact(self, count: int) -> bytes:
        while len(self._app) < count:
            if self.closed:
                raise StreamClosed("client closed the connection")
            self._app += self._unframe(self._read_decrypted())
            self._flush()
        data = bytes(self._app[:count])
        del self._app[:count]
        return data

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(self.outgoing(data))

    def take_read_ahead(self) -> bytes:
        """AMQP bytes that arrived with the last handshake read (a pipelined AMQP header)."""
        if self._tls is not None:
            self._app += self._unframe(self._decrypt(b""))
        data = bytes(self._app)
        self._app.clear()
        return data

    # -- transformations -----------------------------------------------------------------------
    def _decrypt(self, raw: bytes) -> bytes:
        if self._tls is None:
            return raw
        self._incoming_bio.write(raw)
        plain: list[bytes] = []
        while True:
            try:
                chunk = self._tls.read(CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            if not chunk:
                break
            plain.append(chunk)
        self.outbox += self._outgoing_bio.read()  # e.g. TLS 1.3 tickets, close_notify replies
        return b"".join(plain)

    def _encrypt(self, data: bytes) -> bytes:
        if self._tls is None:
            return data
        if data:
            self._tls.write(data)
        return self._outgoing_bio.read()

    def _unframe(self, data: bytes) -> bytes:
        if self._ws is None:
            return data
        payload, control = self._ws.feed(data)
        for opcode, body in control:
            if opcode == websocket.PING:
                self.outbox += self._encrypt(websocket.encode_frame(websocket.PONG, body))
            elif opcode == websocket.CLOSE:
                self.closed = True
                if not self._said_goodbye:
                    self._said_goodbye = True
                    self.outbox += self._encrypt(websocket.close_frame(websocket.NORMAL_CLOSURE))
        return payload

    def incoming(self, raw: bytes) -> bytes:
        """Raw client bytes -> AMQP bytes (replies the layers owe the client go to outbox)."""
        return self._unframe(self._decrypt(raw))

    def outgoing(self, data: bytes) -> bytes:
        """AMQP bytes -> raw bytes for the client."""
        if self._ws is not None:
            if not data:
                return b""
            data = websocket.encode_frame(websocket.BINARY, data)
        return self._encrypt(data)

    def goodbye(self, code: int = websocket.NORMAL_CLOSURE, reason: str = "") -> bytes:
        """Raw bytes that close the WebSocket and TLS layers politely (best effort)."""
        out = b""
        if self._ws is not None and not self._said_goodbye:
            self._said_goodbye = True
            out += self._encrypt(websocket.close_frame(code, reason))
        if self._tls is not None:
            with contextlib.suppress(ssl.SSLError):
                self._tls.unwrap()
            out += self._outgoing_bio.read()
        return out


Adopt = Callable[[socket.socket, SaslResult], None]


class Connection:
    """The thread body for one accepted socket (see the module docstring)."""

    def __init__(
        self,
        sock: socket.socket,
        peer: object,
        listener: Listener,
        policy: SasPolicy | None,
        tls: ssl.SSLContext | None,
        adopt: Adopt,
        stopping: Callable[[], bool],
    ) -> None:
        self.sock = sock
        self.peer = peer
        self.listener = listener
        self.policy = policy
        self.tls = tls if listener.tls else None
        self.adopt = adopt
        self.stopping = stopping
        self.name = f"{listener.scheme} connection from {_peer(peer)}"

    def run(self) -> None:
        broker: socket.socket | None = None
        try:
            stream = ClientStream(self.sock, self.tls, self.listener.websocket)
            self.sock.settimeout(HANDSHAKE_TIMEOUT)
            try:
                stream.open()
                outcome = handshake(stream, self.policy)
            except (OSError, SaslError, ssl.SSLError, websocket.WebSocketError) as exc:
                LOG.info("%s dropped before AMQP: %s", self.name, exc or type(exc).__name__)
                return
            if outcome is None:
                return
            result, already_read = outcome
            ours, broker = socket.socketpair()
            try:
                self.adopt(ours, result)
            except Exception:
                ours.close()
                raise
            self._pump(stream, broker, already_read + stream.take_read_ahead())
        except Exception:
            LOG.exception("%s failed; dropping it", self.name)
        finally:
            for end in (self.sock, broker):
                if end is not None:
                    with contextlib.suppress(OSError):
                        end.close()

    def _pump(self, stream: ClientStream, broker: socket.socket, first: bytes) -> None:
        rewriter = FrameRewriter(self.name)
        client = self.sock
        client.setblocking(False)
        broker.setblocking(False)
        to_broker = bytearray(rewriter.from_client(first))
        to_client = bytearray(stream.outbox)
        stream.outbox.clear()
        client_in = True  # still reading the client
        client_out = True  # still able to write to the client
        broker_in = True  # still reading Proton's end
        broker_write_shut = False
        wind_down_until: float | None = None
        while not self.stopping():
            if not client_in and not to_broker and not broker_write_shut:
                # the client is done: let Proton read EOF (no broken pipe on its side)
                _quietly(lambda: broker.shutdown(socket.SHUT_WR))
                broker_write_shut = True
            if not broker_in and (not to_client or not client_out):
                break  # Proton closed and everything it said has been handed on
            if not client_in or not broker_in:
                now = time.monotonic()
                if wind_down_until is None:
                    wind_down_until = now + WIND_DOWN
                elif now > wind_down_until:
                    LOG.info("%s: closing after %.0f s of wind-down", self.name, WIND_DOWN)
                    break
            readers = []
            if client_in and len(to_broker) < HIGH_WATER:
                readers.append(client)
            if broker_in and len(to_client) < HIGH_WATER:
                readers.append(broker)
            writers = []
            if to_client and client_out:
                writers.append(client)
            if to_broker and not broker_write_shut:
                writers.append(broker)
            try:
                readable, writable, _ = select_by_poll(readers, writers, [], POLL)
            except (OSError, ValueError):
                break
            if client in readable:
                raw: bytes | None
                try:
                    raw = client.recv(CHUNK)
                except (BlockingIOError, InterruptedError):
                    raw = None
                except OSError as exc:
                    LOG.debug("%s: client went away (%s)", self.name, exc)
                    client_in = client_out = False
                    to_client.clear()
                    raw = None
                if raw == b"":
                    client_in = False
                elif raw:
                    try:
                        data = stream.incoming(raw)
                    except websocket.WebSocketError as exc:
                        LOG.info("%s: bad WebSocket frame: %s", self.name, exc)
                        to_client += stream.goodbye(exc.code, str(exc))
                        client_in = False
                        data = b""
                    except ssl.SSLError as exc:
                        LOG.info("%s: TLS error: %s", self.name, exc)
                        client_in = client_out = False
                        to_client.clear()
                        data = b""
                    to_client += stream.outbox
                    stream.outbox.clear()
                    to_broker += rewriter.from_client(data)
                    if stream.closed:
                        client_in = False
            if broker in readable:
                said: bytes | None
                try:
                    said = broker.recv(CHUNK)
                except (BlockingIOError, InterruptedError):
                    said = None
                except OSError:
                    said = b""
                if said == b"":
                    broker_in = False
                    if client_out:
                        to_client += stream.goodbye()
                elif said and client_out:
                    to_client += stream.outgoing(rewriter.from_broker(said))
            if client in writable and to_client:
                try:
                    sent = client.send(to_client)
                    del to_client[:sent]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError as exc:
                    LOG.debug("%s: client went away (%s)", self.name, exc)
                    client_in = client_out = False
                    to_client.clear()
            if broker in writable and to_broker:
                try:
                    sent = broker.send(to_broker)
                    del to_broker[:sent]
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    broker_in = False
                    to_broker.clear()
                    broker_write_shut = True
        if rewriter.renumbered:
            LOG.info(
                "%s: renumbered %d out-of-sequence delivery-ids", self.name, rewriter.renumbered
            )


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(OSError):
        action()


def _peer(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


def start(connection: Connection) -> threading.Thread:
    thread = threading.Thread(target=connection.run, name="connection", daemon=True)
    thread.start()
    return thread
