"""The Qpid Proton adapter of the Service Bus emulator (the CLI is in server.py).

The Proton handler here is only the adapter: it turns AMQP attaches, transfers and dispositions
into calls on the pure broker core (broker.py, management.py, auth.py) and back. One reactor
thread; timers (locks, sessions, TTL, scheduled messages) run every TICK seconds. Connections
(plain, TLS, WebSocket) are accepted by one thread; each gets a bridge.Connection thread that
runs TLS, the WebSocket upgrade and SASL and then relays AMQP to the reactor over a socket pair.

How the SDK sees some answers (read from azure.servicebus._pyamqp and _transport):
* a refused attach (unknown entity, bad session, next-available timeout) is answered like
  Service Bus does: an attach whose node terminus is null, then a detach carrying the error
  (amqp:not-found -> MessagingEntityNotFoundError, com.microsoft:timeout ->
  OperationTimeoutError, com.microsoft:session-cannot-be-locked -> SessionCannotBeLockedError);
* next-available session: the SDK puts max_wait_time (ms, minus jitter) in the link property
  com.microsoft:timeout; with no unlocked session holding messages by then, the attach is refused
  with com.microsoft:timeout (60 s when the client sends none). The SDK retries that
  retry_total times before raising OperationTimeoutError;
* peek-lock settlement: the SDK sends its disposition unsettled and waits for the broker's
  outcome, so every outcome is echoed (or rejected with com.microsoft:message-lock-lost).
"""

from __future__ import annotations

import json
import logging
import queue
import select
import socket
import ssl
import sys
import threading
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from proton import Condition, Delivery, Endpoint, Link, Terminus, Transport, symbol, ulong
from proton._handlers import IOHandler
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, EventInjector

from emulators.servicebus import bridge
from emulators.servicebus.auth import (
    Rights,
    SasPolicy,
    check_token,
    jwt_claims,
    unauthorized_description,
)
from emulators.servicebus.bridge import Listener
from emulators.servicebus.broker import (
    BrokerError,
    EntityNotFound,
    InvalidRequest,
    MessageStore,
    Namespace,
    Queue,
    Resolved,
    SendTarget,
    check_size,
    entity_path,
)
from emulators.servicebus.codec import (
    MessageDecodeError,
    decode_sections,
    decode_value_message,
    encode_value_message,
    read_value,
    split_batch,
)
from emulators.servicebus.management import Response
from emulators.servicebus.management import handle as handle_management
from emulators.servicebus.sasl import SaslResult
from emulators.servicebus.wire import encode_delivery, to_ticks

LOG = logging.getLogger("sebridge.servicebus_emulator")

TICK = 0.05
CREDIT = 500  # credit kept open on incoming links
MAX_FRAME_SIZE = 65536
CHANNEL_MAX = 4999
IDLE_TIMEOUT = 240.0
DEFAULT_SESSION_WAIT = 60.0  # next-available wait when the client sends no com.microsoft:timeout
SESSION_FILTER = symbol("com.microsoft:session-filter")
LOCKED_UNTIL_UTC = symbol("com.microsoft:locked-until-utc")
MAX_BATCH_SIZE = symbol("com.microsoft:max-message-batch-size")
OPERATION_TIMEOUT = "com.microsoft:timeout"


@dataclass(eq=False)
class ConnState:
    authorized: bool = False
    # Whose JWT was put on $cbs, when role assignments decide what it may do (None: a SAS key or
    # SASL PLAIN with it, or no role assignments: everything).
    principal: str | None = None
    links: list[LinkState] = field(default_factory=list)
    replies: dict[str, Link] = field(default_factory=dict)


@dataclass(eq=False)
class LinkState:
    """What one attached link is for. Its identity is the broker's lock/session ``owner``."""

    kind: str  # target | consumer | cbs | management | reply
    link: Link
    conn: ConnState
    resolved: Resolved | None = None
    store: MessageStore | None = None
    target: SendTarget | None = None
    peek_lock: bool = True
    session_id: str | None = None
    session_mode: bool = False
    closed: bool = False
    deadline: float = 0.0  # for a pending next-available session attach


class EmulatorHandler(MessagingHandler):
    def __init__(
        self,
        namespace: Namespace,
        listeners: list[Listener],
        policy: SasPolicy | None,
        *,
        tls: ssl.SSLContext | None = None,
        ca_cert: Path | None = None,
        tls_info: Path | None = None,
        listen_info: Path | None = None,
        rights: Rights | None = None,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=False)
        self.handlers = []  # raw events only: this class does its own flow and settlement
        self.namespace = namespace
        self.listeners = listeners
        self.host = str(listeners[0].sock.getsockname()[0])
        self.policy = policy
        self.rights = rights  # role assignments for JWT principals; None: any JWT may do anything
        self.tls = tls
        self.ca_cert = ca_cert
        self.tls_info = tls_info
        self.listen_info = listen_info
        self.bound_port = listeners[0].port
        self.stop_requested = False
        self._adopt: queue.Queue[tuple[socket.socket, SaslResult]] = queue.Queue()
        self._injector = EventInjector()
        self._container: Any = None
        self._consumers: dict[MessageStore, list[LinkState]] = {}
        self._pending: list[LinkState] = []
        self._dirty: set[MessageStore] = set()
        self._tag = 0
        self.stats: dict[str, int] = {}
        for store in namespace.stores():
            store.notify = self._dirty.add
            store.session_kept_alive = _waiting_for_messages

    # -- lifecycle ---------------------------------------------------------------------------
    def on_reactor_init(self, event: Any) -> None:
        container = self._container = event.container
        container.selectable(self._injector)
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()
        ports = {listener.scheme: listener.port for listener in self.listeners}
        if self.tls_info is not None and "amqps" in ports:
            self.tls_info.write_text(
                json.dumps({"port": ports["amqps"], "ca_cert": str(self.ca_cert)})
            )
        if self.listen_info is not None:
            self.listen_info.write_text(json.dumps({**ports, "ca_cert": _str(self.ca_cert)}))
        shown = "127.0.0.1" if self.host == "127.0.0.1" else self.host
        for listener in self.listeners:  # the first line is amqp://: tools read its port
            sys.stdout.write(f"listening on {listener.url(shown)}\n")
            LOG.info("listening on %s", listener.url(shown))
        sys.stdout.flush()
        if self.ca_cert is not None:
            LOG.info("TLS certificate (self-signed, trust it to connect): %s", self.ca_cert)
        container.schedule(TICK, self)

    # -- accepting connections (TLS, WebSocket and SASL run in bridge.py, then the reactor) ---
    def _accept_loop(self) -> None:
        by_fd = {listener.sock.fileno(): listener for listener in self.listeners}
        for listener in self.listeners:
            listener.sock.setblocking(False)
        while not self.stop_requested:
            try:
                ready, _, _ = select.select(list(by_fd), [], [], 0.5)
            except (OSError, ValueError):
                if self.stop_requested:
                    return
                LOG.exception("waiting for connections failed; carrying on")
                time.sleep(0.1)
                continue
            for fd in ready:
                listener = by_fd[fd]
                try:
                    sock, peer = listener.sock.accept()
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    if self.stop_requested:
                        return
                    LOG.exception("accept on %s failed; carrying on", listener.scheme)
                    time.sleep(0.1)
                    continue
                sock.setblocking(True)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                connection = bridge.Connection(
                    sock,
                    peer,
                    listener,
                    self.policy,
                    self.tls,
                    self._hand_over,
                    lambda: self.stop_requested,
                )
                bridge.start(connection)

    def _hand_over(self, sock: socket.socket, result: SaslResult) -> None:
        """Called on a connection's thread once SASL is done: the reactor takes ``sock``."""
        sock.setblocking(False)
        self._adopt.put((sock, result))
        self._injector.trigger(ApplicationEvent("sb_adopt"))

    def on_sb_adopt(self, event: Any) -> None:
        container = self._container
        while True:
            try:
                sock, result = self._adopt.get_nowait()
            except queue.Empty:
                return
            try:
                connection = container.connection(self)
                connection.sbsasl = result
                # marks it as accepted (a socket is attached): Proton must not dial out for it
                connection._acceptor = self
                transport = Transport(Transport.SERVER)
                transport.require_auth(False)
                # what Service Bus advertises in its open frame: 64 KiB frames, 4999 channels,
                # and a 240 s idle time-out (a connection with no traffic for that long is
                # closed; the SDK's keep-alive exists to prevent it)
                transport.max_frame_size = MAX_FRAME_SIZE
                transport.channel_max = CHANNEL_MAX
                transport.idle_timeout = IDLE_TIMEOUT
                transport.bind(connection)
                selectable = container.selectable(delegate=sock)
                selectable._transport = transport
                transport._selectable = selectable
                IOHandler.update(transport, selectable, container.now)
            except Exception:
                LOG.exception("could not hand a connection to the reactor")
                sock.close()

    def on_timer_task(self, event: Any) -> None:
        if self.stop_requested:
            LOG.info("stopping; deliveries and outcomes: %s", self.stats)
            self._injector.close()
            for listener in self.listeners:
                with suppress(OSError):
                    listener.sock.close()
            event.container.stop()
            return
        now = time.time()
        try:
            self._tick(now)
        except Exception:
            LOG.exception("timer tick failed; carrying on")
        event.container.schedule(TICK, self)

    def _tick(self, now: float) -> None:
        for target in self.namespace.targets():
            target.tick(now)
        for store in self.namespace.stores():
            for owner, sid in store.tick(now):
                if isinstance(owner, LinkState) and not owner.closed:
                    LOG.info("session %r lock expired on %s", sid, store.path)
                    self._close_link(
                        owner, "com.microsoft:session-lock-lost", f"session {sid} lock expired"
                    )
        if self._pending:
            for state in list(self._pending):
                self._try_next_session(state, now)
        self._flush(now)

    # -- connections -------------------------------------------------------------------------
    def on_transport_error(self, event: Any) -> None:
        condition = event.transport.condition
        if condition is not None:
            # a client that broke the protocol: Proton closes its connection, others carry on
            LOG.warning(
                "closing a connection on a protocol error: %s: %s",
                condition.name,
                condition.description,
            )

    def _conn_state(self, conn: Any) -> ConnState:
        state: ConnState | None = getattr(conn, "sbconn", None)
        if state is None:
            result: SaslResult | None = getattr(conn, "sbsasl", None)
            authenticated = bool(result and result.authenticated)
            state = conn.sbconn = ConnState(authorized=self.policy is None or authenticated)
        return state

    def on_connection_remote_open(self, event: Any) -> None:
        conn = event.connection
        self._conn_state(conn)
        if conn.state & Endpoint.LOCAL_UNINIT:
            conn.container = "sebridge-servicebus-emulator"
            conn.open()

    def on_session_remote_open(self, event: Any) -> None:
        if event.session.state & Endpoint.LOCAL_UNINIT:
            event.session.open()

    def on_session_remote_close(self, event: Any) -> None:
        with suppress(Exception):
            event.session.close()

    def on_connection_remote_close(self, event: Any) -> None:
        self._drop_connection(event.connection)
        with suppress(Exception):
            event.connection.close()

    def on_transport_closed(self, event: Any) -> None:
        if event.connection is not None:
            self._drop_connection(event.connection)

    def _drop_connection(self, conn: Any) -> None:
        state: ConnState | None = getattr(conn, "sbconn", None)
        if state is None:
            return
        for link_state in list(state.links):
            self._forget(link_state)
        state.links.clear()
        self._flush(time.time())

    # -- attach ------------------------------------------------------------------------------
    def on_link_remote_open(self, event: Any) -> None:
        link = event.link
        if not link.state & Endpoint.LOCAL_UNINIT:
            return
        conn = self._conn_state(link.connection)
        now = time.time()
        try:
            if link.is_receiver:
                self._attach_incoming(link, conn)
            else:
                self._attach_outgoing(link, conn, now)
        except BrokerError as exc:
            LOG.info("refusing link %r: %s", link.name, exc.description)
            self._refuse(link, exc.condition, exc.description)
        except Exception:
            LOG.exception("attach of link %r failed; refusing it", link.name)
            with suppress(Exception):
                self._refuse(link, "amqp:internal-error", "the emulator failed on this attach")
        self._flush(now)

    def _open(self, link: Link) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        link.open()

    def _refuse(self, link: Link, condition: str, description: str) -> None:
        # Like Service Bus: attach with the node's terminus null, then detach with the error.
        # The SDK reads the null terminus as "link refused" and raises from the detach's error.
        if link.is_receiver:
            link.source.copy(link.remote_source)
            link.target.type = Terminus.UNSPECIFIED
        else:
            link.target.copy(link.remote_target)
            link.source.type = Terminus.UNSPECIFIED
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        link.open()
        link.condition = error_condition(condition, description)
        link.close()

    def _authorize(self, conn: ConnState, address: str, claim: str | None = None) -> None:
        if not conn.authorized:
            raise _Unauthorized(f"put a valid token on $cbs before attaching to {address!r}")
        missing = self._missing_claim(conn, address, claim)
        if missing is not None:
            raise _Unauthorized(missing)

    def _missing_claim(self, conn: ConnState, address: str, claim: str | None) -> str | None:
        """Service Bus's description when the connection's principal lacks ``claim`` on the
        entity at ``address``, else None."""
        if claim is None or self.rights is None or conn.principal is None:
            return None
        entity = entity_path(address)
        if claim in self.rights.claims(conn.principal, entity):
            return None
        LOG.info("principal %s lacks %s on %s", conn.principal, claim, entity)
        return unauthorized_description(claim, self.namespace.name, entity)

    def _attach_incoming(self, link: Link, conn: ConnState) -> None:
        address = link.remote_target.address or ""
        if address == "$cbs":
            state = LinkState("cbs", link, conn)
        else:
            resolved = self.namespace.resolve(address)
            # Sending needs Send; a management link is checked per operation (_request).
            self._authorize(conn, address, None if resolved.management else "Send")
            if resolved.management:
                state = LinkState("management", link, conn, resolved=resolved)
            elif resolved.target is None:
                raise _NotAllowed(f"cannot send to {address!r}: send to a queue or a topic")
            else:
                state = LinkState("target", link, conn, resolved=resolved, target=resolved.target)
                # Service Bus advertises the entity's limits: the SDK sizes
                # ServiceBusMessageBatch from these two (create_message_batch)
                settings = resolved.target.settings
                link.max_message_size = settings.max_message_size
                link.properties = {MAX_BATCH_SIZE: ulong(settings.max_batch_size)}
        link.sbstate = state
        conn.links.append(state)
        self._open(link)
        link.flow(CREDIT)

    def _attach_outgoing(self, link: Link, conn: ConnState, now: float) -> None:
        address = link.remote_source.address or ""
        if address == "$cbs" or address.rstrip("/").lower().endswith("$management"):
            if address != "$cbs":
                self.namespace.resolve(address)
            state = LinkState("reply", link, conn)
            reply_to = link.remote_target.address or link.name
            conn.replies[reply_to] = link
            conn.replies.setdefault(f"node:{address}", link)
            link.sbstate = state
            conn.links.append(state)
            self._open(link)
            return
        resolved = self.namespace.resolve(address)
        self._authorize(conn, address, "Listen")
        store = resolved.store
        if store is None or resolved.management:
            raise _NotAllowed(f"cannot receive from {address!r}: it is a topic")
        peek_lock = link.remote_snd_settle_mode != Link.SND_SETTLED
        filters = _filters(link)
        wants_session = SESSION_FILTER in filters
        requested = filters.get(SESSION_FILTER)
        if requested is not None and not isinstance(requested, str):
            # Service Bus refuses the attach: session ids are strings
            raise _InvalidField(
                f"the session id filter must be a string, got {type(requested).__name__} "
                f"{requested!r}"
            )
        if wants_session != store.session_mode:
            if wants_session:
                raise InvalidRequest(
                    f"{store.path} does not require sessions; use a plain receiver"
                )
            raise InvalidRequest(
                f"{store.path} requires sessions; use a session receiver (session_id=...)"
            )
        state = LinkState(
            "consumer",
            link,
            conn,
            resolved=resolved,
            store=store,
            peek_lock=peek_lock,
            session_mode=wants_session,
        )
        link.sbstate = state
        conn.links.append(state)
        if not wants_session:
            self._complete_consumer(state)
            return
        if requested is not None:
            info = store.accept_session(str(requested), state, now)
            assert info is not None
            self._complete_consumer(state, info.session_id, info.locked_until)
            return
        timeout_ms = (link.remote_properties or {}).get(symbol(OPERATION_TIMEOUT))
        wait = DEFAULT_SESSION_WAIT if timeout_ms is None else int(timeout_ms) / 1000.0
        state.deadline = now + wait
        self._pending.append(state)
        self._try_next_session(state, now)

    def _try_next_session(self, state: LinkState, now: float) -> None:
        if state.closed:
            self._pending.remove(state)
            return
        assert state.store is not None
        info = state.store.accept_session(None, state, now)
        if info is not None:
            self._pending.remove(state)
            self._complete_consumer(state, info.session_id, info.locked_until)
        elif now >= state.deadline:
            self._pending.remove(state)
            self._forget(state)
            self._refuse(
                state.link,
                "com.microsoft:timeout",
                f"no unlocked session with messages in {state.store.path} within the wait time",
            )

    def _complete_consumer(
        self, state: LinkState, session_id: str | None = None, locked_until: float = 0.0
    ) -> None:
        link = state.link
        self._open_without_filter_echo(link, session_id)
        if session_id is not None:
            state.session_id = session_id
            link.properties = {LOCKED_UNTIL_UTC: to_ticks(locked_until)}
        assert state.store is not None
        self._consumers.setdefault(state.store, []).append(state)
        link.open()
        self._dirty.add(state.store)

    def _open_without_filter_echo(self, link: Link, session_id: str | None) -> None:
        link.source.copy(link.remote_source)
        link.target.copy(link.remote_target)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.rcv_settle_mode = link.remote_rcv_settle_mode
        if session_id is not None:
            link.source.filter.clear()
            link.source.filter.put_dict({SESSION_FILTER: session_id})

    # -- detach ------------------------------------------------------------------------------
    def on_link_remote_close(self, event: Any) -> None:
        try:
            self._on_link_remote_close(event)
        except Exception:
            LOG.exception("detach handling failed; carrying on")

    def _on_link_remote_close(self, event: Any) -> None:
        link = event.link
        state: LinkState | None = getattr(link, "sbstate", None)
        if state is not None:
            self._forget(state)
        if not link.state & Endpoint.LOCAL_CLOSED:
            if link.state & Endpoint.LOCAL_UNINIT:
                self._open(link)
            link.close()
        self._flush(time.time())

    def _forget(self, state: LinkState) -> None:
        if state.closed:
            return
        state.closed = True
        if state in state.conn.links:
            state.conn.links.remove(state)
        if state in self._pending:
            self._pending.remove(state)
        if state.store is not None:
            consumers = self._consumers.get(state.store, [])
            if state in consumers:
                consumers.remove(state)
            if state.session_mode:
                state.store.release_session(state, time.time())

    def _close_link(self, state: LinkState, condition: str, description: str) -> None:
        self._forget(state)
        with suppress(Exception):
            state.link.condition = error_condition(condition, description)
            state.link.close()

    # -- delivery ----------------------------------------------------------------------------
    def on_link_flow(self, event: Any) -> None:
        try:
            self._on_link_flow(event)
        except Exception:
            LOG.exception("flow handling failed; carrying on")

    def _on_link_flow(self, event: Any) -> None:
        link = event.link
        state: LinkState | None = getattr(link, "sbstate", None)
        if state is not None and state.kind == "consumer" and not state.closed:
            self._pump(state, time.time())
        elif link.is_sender and link.drain_mode:
            link.drained()

    def on_delivery(self, event: Any) -> None:
        link = event.link
        dlv = event.delivery
        state: LinkState | None = getattr(link, "sbstate", None)
        now = time.time()
        if link.is_receiver:
            if not dlv.readable or dlv.partial:
                return
            raw = link.recv(dlv.pending) or b""
            link.advance()
            if state is None:
                dlv.update(Delivery.REJECTED)
                dlv.settle()
                return
            try:
                self._incoming(state, dlv, raw, now)
            except Exception:
                LOG.exception("failed to handle a transfer on %r; rejecting it", link.name)
                self._reject(dlv, "amqp:internal-error", "the emulator failed on this message")
            if link.credit < CREDIT // 2:
                link.flow(CREDIT - link.credit)
        elif state is not None and state.kind == "consumer":
            try:
                self._settle_outgoing(state, dlv, now)
            except Exception:
                LOG.exception("failed to settle a delivery on %r", link.name)
                self._reject(dlv, "amqp:internal-error", "the emulator failed to settle this")
        elif dlv.settled:  # proton: settled means settled by the peer
            dlv.settle()
        self._flush(now)

    def _count(self, what: str) -> None:
        self.stats[what] = self.stats.get(what, 0) + 1

    def _reject(self, dlv: Delivery, condition: str, description: str) -> None:
        dlv.local.condition = error_condition(condition, description)
        dlv.update(Delivery.REJECTED)
        dlv.settle()

    def _incoming(self, state: LinkState, dlv: Delivery, raw: bytes, now: float) -> None:
        if state.kind == "target":
            assert state.target is not None
            try:
                self._accept_messages(state.target, raw, now)
            except MessageDecodeError as exc:
                LOG.warning("undecodable message for %s: %s", state.target.name, exc)
                self._reject(dlv, "amqp:decode-error", str(exc))
                return
            except BrokerError as exc:
                LOG.info("message refused by %s: %s", state.target.name, exc.description)
                self._reject(dlv, exc.condition, exc.description)
                return
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            return
        if state.kind in {"cbs", "management"}:
            try:
                self._request(state, raw, now)
            except MessageDecodeError as exc:
                LOG.warning("undecodable %s request: %s", state.kind, exc)
                self._reject(dlv, "amqp:decode-error", str(exc))
                return
            dlv.update(Delivery.ACCEPTED)
            dlv.settle()
            return
        self._reject(dlv, "amqp:not-allowed", "this link does not take messages")

    def _accept_messages(self, target: SendTarget, raw: bytes, now: float) -> None:
        sections = decode_sections(raw)
        batch = split_batch(raw, sections)
        messages = batch if batch is not None else [sections]
        check_size(target, len(raw), None if batch is not None else sections.properties[0])
        if isinstance(target, Queue) and target.store.session_mode:
            for message in messages:
                if message.properties[10] is None:
                    raise _NotAllowed(
                        "The SessionId was not set on a message, and it cannot be sent to the "
                        f"entity {target.name!r}. Entities that have session support enabled "
                        "can only receive messages that have the SessionId set to a valid value."
                    )
        for message in messages:
            target.accept(message, now)

    def _request(self, state: LinkState, raw: bytes, now: float) -> None:
        sections, value = decode_value_message(raw)
        app = sections.application
        message_id = sections.properties[0]
        reply_to = sections.properties[4]
        operation = str(app.get("operation", ""))
        if state.kind == "cbs":
            if operation != "put-token":
                status, description = 400, f"unsupported $cbs operation {operation!r}"
            else:
                verdict = check_token(
                    str(app.get("type", "")),
                    str(value or ""),
                    str(app.get("name", "")),
                    self.policy,
                    now,
                )
                status, description = verdict.status, verdict.description
                missing = self._missing_audience(str(app.get("name", ""))) if verdict.ok else None
                if missing is not None:
                    # Service Bus checks the token first, then the entity: 404 on put-token,
                    # which the SDK raises as ServiceBusAuthenticationError
                    status, description = 404, missing
                    LOG.info("put-token for a missing entity refused: %s", description)
                elif verdict.ok:
                    status, description = self._admit(state.conn, str(value or ""), description)
                else:
                    LOG.info("put-token (%s) refused: %s", app.get("type"), description)
            props: dict[Any, Any] = {"status-code": status, "status-description": description}
            payload = encode_value_message(None, props, message_id)
        else:
            assert state.resolved is not None
            address = str(state.link.remote_target.address or "")
            missing = self._missing_claim(state.conn, address, _operation_claim(operation))
            if missing is not None:
                response = Response(401, missing, condition="amqp:unauthorized-access")
            else:
                response = handle_management(state.resolved, operation, value, now, lambda: None)
            if response.status >= 300:
                LOG.info(
                    "%s on %s: %s %s",
                    operation,
                    state.link.remote_target.address,
                    response.status,
                    response.description,
                )
            props = {
                "statusCode": response.status,
                "statusDescription": response.description,
            }
            if response.condition:
                props["errorCondition"] = symbol(response.condition)
            payload = encode_value_message(response.value, props, message_id)
        link = state.conn.replies.get(str(reply_to)) if reply_to is not None else None
        if link is None:
            node = state.link.remote_target.address
            link = state.conn.replies.get(f"node:{node}")
        if link is None:
            LOG.warning("no reply link for %s request (reply_to=%r)", operation, reply_to)
            return
        self._send(link, payload, settle=True)

    def _admit(self, conn: ConnState, token: str, accepted: str) -> tuple[int, str]:
        """An accepted put-token: whose it is, when role assignments decide what it may do."""
        if self.rights is not None and not token.startswith("SharedAccessSignature "):
            claims = jwt_claims(token) or {}
            principal = claims.get("oid")
            if not isinstance(principal, str) or not principal:
                LOG.info("put-token refused: a JWT without an oid claim")
                return 401, "the token names no principal (no oid claim)"
            conn.principal = principal
        conn.authorized = True
        return 202, accepted

    def _missing_audience(self, audience: str) -> str | None:
        """Service Bus's put-token description when ``audience`` names no entity, else None."""
        if not entity_path(audience):
            return None  # the namespace itself
        try:
            self.namespace.resolve(audience)
        except EntityNotFound:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
            return (
                f"The messaging entity '{audience}' could not be found. To know more visit "
                f"https://aka.ms/sbResourceMgrExceptions.  TrackingId:{uuid.uuid4()}, "
                f"SystemTracker:{self.namespace.name}:{entity_path(audience)}, Timestamp:{stamp}"
            )
        return None

    def _send(
        self, link: Link, payload: bytes, *, settle: bool, tag: bytes | None = None
    ) -> Delivery:
        if tag is None:
            self._tag += 1
            tag = self._tag.to_bytes(8, "big")
        dlv = link.delivery(cast(Any, tag))  # proton's stub says str; bytes is what it takes
        link.stream(payload)
        link.advance()
        if settle:
            dlv.settle()
        return dlv

    # -- consumers ---------------------------------------------------------------------------
    def _flush(self, now: float) -> None:
        try:
            self._flush_dirty(now)
        except Exception:
            LOG.exception("dispatching messages failed; carrying on")

    def _flush_dirty(self, now: float) -> None:
        while self._dirty:
            store = self._dirty.pop()
            # A session that just got messages (or was released) goes at once to a
            # next-available accept already waiting on this entity, as Service Bus hands it
            # over, not at the next timer tick.
            for waiting in [s for s in self._pending if s.store is store]:
                self._try_next_session(waiting, now)
            consumers = self._consumers.get(store)
            if not consumers:
                continue
            # rotate so several receivers on one entity share the messages
            consumers.append(consumers.pop(0))
            for state in list(consumers):
                self._pump(state, now)

    def _pump(self, state: LinkState, now: float) -> None:
        link = state.link
        store = state.store
        assert store is not None
        if not state.session_mode or state.session_id is not None:
            while link.credit > 0:
                message = store.acquire(
                    now, state, peek_lock=state.peek_lock, session_id=state.session_id
                )
                if message is None:
                    break
                locked = state.peek_lock and not state.session_mode
                token = message.lock_token
                payload = encode_delivery(message, locked=locked, lock_token=token, on_link=True)
                # peek-lock: the lock token is the delivery tag (the SDK reads it back from
                # there); receive-and-delete (settled): an empty tag, as Service Bus sends
                tag = token.bytes_le if token is not None else b""
                dlv = self._send(link, payload, settle=not state.peek_lock, tag=tag)
                self._count("delivered")
                if token is not None:
                    dlv.sbtoken = token
        if link.drain_mode and link.credit > 0:
            link.drained()

    def _settle_outgoing(self, state: LinkState, dlv: Delivery, now: float) -> None:
        token: uuid.UUID | None = getattr(dlv, "sbtoken", None)
        outcome = dlv.remote_state
        if token is None or state.store is None:
            if dlv.settled:
                dlv.settle()
            return
        store = state.store
        remote = dlv.remote
        self._count(_OUTCOMES.get(outcome, f"outcome-{outcome}"))
        try:
            if outcome == Delivery.ACCEPTED:
                store.complete(token, now)
            elif outcome == Delivery.REJECTED:
                raw_info: Any = (remote.condition.info if remote.condition else None) or {}
                info = {str(k): v for k, v in dict(raw_info).items()}
                reason = info.get("DeadLetterReason")
                description = info.get("DeadLetterErrorDescription")
                store.dead_letter(
                    token,
                    now,
                    None if reason is None else str(reason),
                    None if description is None else str(description),
                )
            elif outcome == Delivery.RELEASED:
                store.abandon(token, now, count=False)
            elif outcome == Delivery.MODIFIED:
                if remote.undeliverable:
                    store.defer(token, now)
                else:
                    store.abandon(token, now, count=bool(remote.failed))
                dlv.local.failed = remote.failed
                dlv.local.undeliverable = remote.undeliverable
            else:
                return  # not a terminal outcome yet
            if not dlv.settled:
                dlv.update(outcome)
            dlv.settle()
        except BrokerError as exc:
            LOG.info("settlement on %s refused: %s", store.path, exc.description)
            if dlv.settled:
                dlv.settle()
            else:
                self._reject(dlv, exc.condition, exc.description)


_OUTCOMES: dict[Any, str] = {
    Delivery.ACCEPTED: "accepted",
    Delivery.REJECTED: "rejected",
    Delivery.RELEASED: "released",
    Delivery.MODIFIED: "modified",
    Delivery.RECEIVED: "received",
}


# Management operations that change what is sent need Send; every other one reads (Listen).
_SEND_OPERATIONS = frozenset(
    {"com.microsoft:schedule-message", "com.microsoft:cancel-scheduled-message"}
)


def _operation_claim(operation: str) -> str:
    return "Send" if operation in _SEND_OPERATIONS else "Listen"


class _Unauthorized(BrokerError):
    condition = "amqp:unauthorized-access"
    status = 401


class _InvalidField(BrokerError):
    condition = "amqp:invalid-field"
    status = 400


class _NotAllowed(BrokerError):
    condition = "amqp:not-allowed"
    status = 403


def _waiting_for_messages(owner: Any) -> bool:
    """A session receiver with credit outstanding: Service Bus does not let its lock lapse."""
    return isinstance(owner, LinkState) and not owner.closed and owner.link.credit > 0


def _str(value: object) -> str | None:
    return None if value is None else str(value)


def error_condition(condition: str, description: str) -> Condition:
    """An AMQP error as Service Bus sends them: ``info`` is always a map (with a tracking id).

    azure-servicebus reads a rejected transfer's ``error[2]`` unconditionally; without it the
    send's completion callback fails and the sender waits out its timeout instead of raising.
    """
    tracking = str(uuid.uuid4())
    return Condition(
        condition,
        f"{description} TrackingId:{tracking}",
        {symbol("com.microsoft:tracking-id"): tracking},
    )


def _filters(link: Link) -> dict[Any, Any]:
    data = link.remote_source.filter
    if data is None:
        return {}
    data.rewind()
    if not data.next():
        return {}
    value = read_value(data)
    return dict(value) if isinstance(value, dict) else {}
