"""The broker core: queues, topics, subscriptions, dead-letter queues, locks, sessions.

Plain Python, no I/O and no clock of its own: every operation takes ``now`` (epoch seconds) so
tests drive time. Links are opaque ``owner`` objects here; the Proton adapter maps deliveries
to lock tokens. Available messages sit in heaps ordered by sequence number, locks and expiries
in deadline heaps with lazy deletion, so a delivery never scans the store.
"""

from __future__ import annotations

import heapq
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from emulators.servicebus.codec import PROPERTY_FIELDS, Sections, with_application_properties
from emulators.servicebus.config import (
    NamespaceConfig,
    ReceiverSettings,
    RuleConfig,
    SenderSettings,
)
from emulators.servicebus.sqlfilter import MessageFacts

DLQ_SUFFIX = "$deadletterqueue"
MAX_TTL_MS = 2**32 - 1  # header ttl is an AMQP uint


class BrokerError(Exception):
    """A request the broker refuses; ``condition`` is the AMQP error condition."""

    condition = "amqp:internal-error"
    status = 500

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


class EntityNotFound(BrokerError):
    condition = "amqp:not-found"
    status = 404


class LockLost(BrokerError):
    condition = "com.microsoft:message-lock-lost"
    status = 410


class MessageNotFound(BrokerError):
    condition = "com.microsoft:message-not-found"
    status = 404


class SessionCannotBeLocked(BrokerError):
    condition = "com.microsoft:session-cannot-be-locked"
    status = 410


class SessionLockLost(BrokerError):
    condition = "com.microsoft:session-lock-lost"
    status = 410


class MessageSizeExceeded(BrokerError):
    condition = "amqp:link:message-size-exceeded"  # the SDK raises MessageSizeExceededError
    status = 413


class InvalidRequest(BrokerError):
    condition = "com.microsoft:argument-error"
    status = 400


class State(Enum):
    AVAILABLE = 0
    LOCKED = 1
    DEFERRED = 2
    GONE = 3


_SYSTEM_FIELDS = {
    "message_id": "message_id",
    "group_id": "session_id",
    "subject": "subject",
    "correlation_id": "correlation_id",
    "to": "to",
    "reply_to": "reply_to",
    "reply_to_group_id": "reply_to_session_id",
    "content_type": "content_type",
}


def message_facts(sections: Sections) -> MessageFacts:
    """What SQL and correlation filters see of a message."""
    system: dict[str, Any] = {}
    for field_name, key in _SYSTEM_FIELDS.items():
        value = sections.properties[PROPERTY_FIELDS.index(field_name)]
        if value is not None:
            system[key] = f"{value}"
    return MessageFacts({k: _plain(v) for k, v in sections.application.items()}, system)


def _plain(value: Any) -> Any:
    """AMQP-typed values (symbol, int32, float32...) as the plain Python values filters compare."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return f"{value}"
    return value


@dataclass(eq=False)
class StoredMessage:
    sequence_number: int
    sections: Sections
    enqueued_at: float
    expires_at: float | None
    ttl_ms: int | None
    session_id: str | None
    delivery_count: int = 0
    state: State = State.AVAILABLE
    lock_token: uuid.UUID | None = None
    locked_until: float = 0.0
    owner: Any = None
    dead_letter_source: str | None = None
    application_raw: bytes | None = None  # re-encoded when the broker adds properties
    was_deferred: bool = False

    def application_bytes(self) -> bytes:
        if self.application_raw is not None:
            return self.application_raw
        return self.sections.application_raw

    def copy_for(self) -> StoredMessage:
        return StoredMessage(
            self.sequence_number,
            self.sections,
            self.enqueued_at,
            self.expires_at,
            self.ttl_ms,
            self.session_id,
        )


@dataclass
class SessionInfo:
    session_id: str
    owner: Any = None
    locked_until: float = 0.0
    state: bytes | None = None
    state_updated_at: float | None = None  # when set-session-state last ran (list filter)
    ready: list[tuple[int, StoredMessage]] = field(default_factory=list)
    locked_tokens: set[uuid.UUID] = field(default_factory=set)


class MessageStore:
    """A queue, a subscription, or a dead-letter queue: what a receiver reads from."""

    def __init__(
        self,
        path: str,
        settings: ReceiverSettings,
        *,
        dead_letter_queue: MessageStore | None = None,
    ) -> None:
        self.path = path
        self.settings = settings
        self.dead_letter_queue = dead_letter_queue
        self.is_dead_letter_queue = dead_letter_queue is None
        self.messages: dict[int, StoredMessage] = {}
        self._ready: list[tuple[int, StoredMessage]] = []
        self._locks: dict[uuid.UUID, StoredMessage] = {}
        self._lock_deadlines: list[tuple[float, int, uuid.UUID]] = []
        self._expiries: list[tuple[float, int]] = []
        self.sessions: dict[str, SessionInfo] = {}
        self._session_deadlines: list[tuple[float, str]] = []
        self.notify: Callable[[MessageStore], None] | None = None
        # Service Bus keeps a session locked while its receiver is waiting for messages (link
        # credit outstanding; azure-service-bus#694): the adapter says whether an owner is
        self.session_kept_alive: Callable[[Any], bool] | None = None

    # -- arrival -----------------------------------------------------------------------------
    def enqueue(self, message: StoredMessage, now: float) -> None:
        self.messages[message.sequence_number] = message
        if message.expires_at is not None and not self.is_dead_letter_queue:
            heapq.heappush(self._expiries, (message.expires_at, message.sequence_number))
        self._make_available(message)

    def _make_available(self, message: StoredMessage) -> None:
        message.state = State.AVAILABLE
        message.lock_token = None
        message.owner = None
        entry = (message.sequence_number, message)
        if self.settings.requires_session and not self.is_dead_letter_queue:
            sid = message.session_id or ""
            info = self.sessions.get(sid)
            if info is None:
                info = self.sessions[sid] = SessionInfo(sid)
            heapq.heappush(info.ready, entry)
        else:
            heapq.heappush(self._ready, entry)
        if self.notify is not None:
            self.notify(self)

    @property
    def session_mode(self) -> bool:
        return self.settings.requires_session and not self.is_dead_letter_queue

    # -- acquisition -------------------------------------------------------------------------
    def acquire(
        self, now: float, owner: Any, *, peek_lock: bool, session_id: str | None = None
    ) -> StoredMessage | None:
        """The next available message for ``owner`` (locked, or removed in receive-and-delete)."""
        if self.session_mode:
            info = self.sessions.get(session_id or "")
            if info is None or info.owner is not owner:
                return None
            heap = info.ready
        else:
            heap = self._ready
        while heap:
            _, message = heapq.heappop(heap)
            if (
                message.state is not State.AVAILABLE
                or self.messages.get(message.sequence_number) is not message
            ):
                continue
            if self._expired(message, now):
                self._expire(message, now)
                continue
            if peek_lock:
                self._lock(message, now, owner)
            else:
                self._remove(message)
            return message
        return None

    def _lock(self, message: StoredMessage, now: float, owner: Any) -> None:
        token = uuid.uuid4()
        message.state = State.LOCKED
        message.lock_token = token
        message.owner = owner
        self._locks[token] = message
        if self.session_mode:
            info = self.sessions[message.session_id or ""]
            info.locked_tokens.add(token)
            message.locked_until = info.locked_until
        else:
            message.locked_until = now + self.settings.lock_duration
            heapq.heappush(
                self._lock_deadlines, (message.locked_until, message.sequence_number, token)
            )

    def _remove(self, message: StoredMessage) -> None:
        message.state = State.GONE
        if message.lock_token is not None:
            self._locks.pop(message.lock_token, None)
            if message.session_id is not None and message.session_id in self.sessions:
                self.sessions[message.session_id].locked_tokens.discard(message.lock_token)
        message.lock_token = None
        self.messages.pop(message.sequence_number, None)

    def _expired(self, message: StoredMessage, now: float) -> bool:
        return (
            not self.is_dead_letter_queue
            and message.expires_at is not None
            and message.expires_at <= now
        )

    def _expire(self, message: StoredMessage, now: float) -> None:
        self._remove(message)
        if self.settings.dead_letter_on_expiration:
            self._to_dead_letter(
                message, "TTLExpiredException", "The message expired and was dead lettered.", now
            )

    # -- settlement --------------------------------------------------------------------------
    def locked(self, token: uuid.UUID, now: float) -> StoredMessage:
        message = self._locks.get(token)
        if message is None or message.state is not State.LOCKED:
            raise LockLost(
                f"The lock supplied is invalid. Either the lock expired, or the message has "
                f"already been removed from the queue. Reference: {self.path}"
            )
        if self.session_mode:
            info = self.sessions.get(message.session_id or "")
            if info is None or info.owner is None or info.locked_until <= now:
                raise SessionLockLost(f"The session lock has expired on {self.path}")
        elif message.locked_until <= now:
            self._unlock(message, now, failed=True)
            raise LockLost(f"The lock on message {message.sequence_number} expired")
        return message

    def complete(self, token: uuid.UUID, now: float) -> None:
        self._remove(self.locked(token, now))

    def abandon(self, token: uuid.UUID, now: float, *, count: bool = True) -> None:
        self._unlock(self.locked(token, now), now, failed=count)

    def defer(self, token: uuid.UUID, now: float) -> None:
        message = self.locked(token, now)
        self._drop_lock(message)
        message.state = State.DEFERRED
        message.was_deferred = True

    def dead_letter(
        self, token: uuid.UUID, now: float, reason: str | None, description: str | None
    ) -> None:
        message = self.locked(token, now)
        self._remove(message)
        self._to_dead_letter(message, reason, description, now)

    def renew_lock(self, token: uuid.UUID, now: float) -> float:
        message = self.locked(token, now)
        if self.session_mode:
            return message.locked_until
        message.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._lock_deadlines, (message.locked_until, message.sequence_number, token))
        return message.locked_until

    def _drop_lock(self, message: StoredMessage) -> None:
        if message.lock_token is not None:
            self._locks.pop(message.lock_token, None)
            info = self.sessions.get(message.session_id or "")
            if info is not None:
                info.locked_tokens.discard(message.lock_token)
        message.lock_token = None
        message.owner = None

    def _unlock(self, message: StoredMessage, now: float, *, failed: bool) -> None:
        self._drop_lock(message)
        if failed:
            message.delivery_count += 1
            if message.delivery_count >= self.settings.max_delivery_count:
                self._remove(message)
                self._to_dead_letter(
                    message,
                    "MaxDeliveryCountExceeded",
                    f"Message could not be consumed after {self.settings.max_delivery_count} "
                    "delivery attempts.",
                    now,
                )
                return
        if self._expired(message, now):
            self._expire(message, now)
            return
        if message.was_deferred:
            message.state = State.DEFERRED
            return
        self._make_available(message)

    def _to_dead_letter(
        self, message: StoredMessage, reason: str | None, description: str | None, now: float
    ) -> None:
        if self.dead_letter_queue is None:
            return  # a dead-lettered message in a dead-letter queue just goes away
        copy = message.copy_for()
        copy.delivery_count = message.delivery_count
        copy.dead_letter_source = self.path
        updates: dict[str, str] = {}
        if reason is not None:
            updates["DeadLetterReason"] = reason
        if description is not None:
            updates["DeadLetterErrorDescription"] = description
        copy.application_raw = with_application_properties(message.application_bytes(), updates)
        self.dead_letter_queue.enqueue(copy, now)

    # -- deferred and peek -------------------------------------------------------------------
    def receive_deferred(
        self, sequence_numbers: Iterable[int], now: float, owner: Any, *, peek_lock: bool
    ) -> list[StoredMessage]:
        found: list[StoredMessage] = []
        for seq in sequence_numbers:
            message = self.messages.get(int(seq))
            if message is None or message.state is not State.DEFERRED:
                raise MessageNotFound(f"deferred message {seq} not found in {self.path}")
            found.append(message)
        for message in found:
            if peek_lock:
                self._lock(message, now, owner)
            else:
                self._remove(message)
        return found

    def peek(self, from_sequence: int, count: int, session_id: str | None) -> list[StoredMessage]:
        out: list[StoredMessage] = []
        for seq in sorted(s for s in self.messages if s >= from_sequence):
            message = self.messages[seq]
            if session_id is not None and message.session_id != session_id:
                continue
            out.append(message)
            if len(out) >= count:
                break
        return out

    # -- sessions ----------------------------------------------------------------------------
    def accept_session(self, session_id: str | None, owner: Any, now: float) -> SessionInfo | None:
        """Lock a named session, or the first unlocked one with messages (None if none)."""
        if session_id is None:
            idle: list[str] = []
            chosen: SessionInfo | None = None
            for info in self.sessions.values():
                if not self._session_free(info, now):
                    continue
                if self._has_ready(info, now):
                    chosen = info
                    break
                if not info.locked_tokens and info.state is None:
                    idle.append(info.session_id)
            for sid in idle:  # forget sessions with nothing left, so this scan stays short
                del self.sessions[sid]
            return None if chosen is None else self._lock_session(chosen, owner, now)
        named = self.sessions.get(session_id)
        if named is None:
            named = self.sessions[session_id] = SessionInfo(session_id)
        if not self._session_free(named, now):
            raise SessionCannotBeLocked(
                f"The requested session '{session_id}' cannot be accepted. "
                "It may be locked by another receiver."
            )
        return self._lock_session(named, owner, now)

    def _session_free(self, info: SessionInfo, now: float) -> bool:
        if info.owner is not None and info.locked_until <= now:
            self._lose_session(info, now)
        return info.owner is None

    def _has_ready(self, info: SessionInfo, now: float) -> bool:
        while info.ready:
            _, message = info.ready[0]
            if (
                message.state is State.AVAILABLE
                and self.messages.get(message.sequence_number) is message
            ):
                if self._expired(message, now):
                    heapq.heappop(info.ready)
                    self._expire(message, now)
                    continue
                return True
            heapq.heappop(info.ready)
        return False

    def _lock_session(self, info: SessionInfo, owner: Any, now: float) -> SessionInfo:
        info.owner = owner
        info.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._session_deadlines, (info.locked_until, info.session_id))
        return info

    def session_for(self, session_id: str, owner: Any, now: float) -> SessionInfo:
        info = self.sessions.get(session_id)
        if info is None or info.owner is None or info.locked_until <= now:
            raise SessionLockLost(f"The session lock for '{session_id}' has expired or was lost")
        if owner is not None and info.owner is not owner:
            raise SessionLockLost(f"The session '{session_id}' is locked by another receiver")
        return info

    def renew_session(self, session_id: str, owner: Any, now: float) -> float:
        return self._extend_session(self.session_for(session_id, owner, now), now)

    def _extend_session(self, info: SessionInfo, now: float) -> float:
        info.locked_until = now + self.settings.lock_duration
        heapq.heappush(self._session_deadlines, (info.locked_until, info.session_id))
        for token in info.locked_tokens:
            self._locks[token].locked_until = info.locked_until
        return info.locked_until

    def release_session(self, owner: Any, now: float) -> None:
        """The owner's link closed: its sessions and their locked messages become available."""
        for info in list(self.sessions.values()):
            if info.owner is owner:
                self._lose_session(info, now, failed=False)

    def _lose_session(self, info: SessionInfo, now: float, *, failed: bool = True) -> None:
        info.owner = None
        for token in list(info.locked_tokens):
            message = self._locks.get(token)
            if message is not None:
                self._unlock(message, now, failed=failed)
        info.locked_tokens.clear()
        if self._has_ready(info, now) and self.notify is not None:
            self.notify(self)

    # -- time --------------------------------------------------------------------------------
    def tick(self, now: float) -> list[tuple[Any, str]]:
        """Expire locks, sessions and messages; return (owner, session_id) of lost sessions."""
        while self._lock_deadlines and self._lock_deadlines[0][0] <= now:
            _deadline, _, token = heapq.heappop(self._lock_deadlines)
            message = self._locks.get(token)
            if message is not None and message.locked_until <= now:
                self._unlock(message, now, failed=True)
        lost: list[tuple[Any, str]] = []
        while self._session_deadlines and self._session_deadlines[0][0] <= now:
            _, sid = heapq.heappop(self._session_deadlines)
            info = self.sessions.get(sid)
            if info is not None and info.owner is not None and info.locked_until <= now:
                if self.session_kept_alive is not None and self.session_kept_alive(info.owner):
                    self._extend_session(info, now)
                    continue
                lost.append((info.owner, sid))
                self._lose_session(info, now)
        while self._expiries and self._expiries[0][0] <= now:
            _, seq = heapq.heappop(self._expiries)
            message = self.messages.get(seq)
            if message is not None and message.state is State.AVAILABLE:
                self._expire(message, now)
        if len(self._expiries) > 2 * len(self.messages) + 1024:
            # settled messages leave their expiry entries behind; drop them in one pass
            self._expiries = [
                (m.expires_at, seq) for seq, m in self.messages.items() if m.expires_at is not None
            ]
            heapq.heapify(self._expiries)
        return lost

    def has_timers(self) -> bool:
        return bool(self._lock_deadlines or self._session_deadlines or self._expiries)


class SendTarget:
    """A queue or a topic: what a sender writes to. Duplicate detection and scheduling live here."""

    def __init__(self, name: str, settings: SenderSettings) -> None:
        self.name = name
        self.settings = settings
        self._next_sequence = 1
        self._seen: dict[str, float] = {}
        self._seen_order: deque[tuple[float, str]] = deque()
        self._scheduled: list[tuple[float, int]] = []
        self._scheduled_messages: dict[int, tuple[Sections, float]] = {}

    def next_sequence(self) -> int:
        seq = self._next_sequence
        self._next_sequence += 1
        return seq

    def is_duplicate(self, sections: Sections, now: float) -> bool:
        if not self.settings.requires_duplicate_detection:
            return False
        while self._seen_order and self._seen_order[0][0] <= now:
            expiry, mid = self._seen_order.popleft()
            if self._seen.get(mid) == expiry:
                del self._seen[mid]
        message_id = sections.properties[0]
        if message_id is None:
            return False
        key = str(message_id)
        if key in self._seen:
            return True
        expiry = now + self.settings.duplicate_window
        self._seen[key] = expiry
        self._seen_order.append((expiry, key))
        return False

    def accept(self, sections: Sections, now: float) -> int | None:
        """Take one sent message; return its sequence number (None for a dropped duplicate)."""
        if self.is_duplicate(sections, now):
            return None
        seq = self.next_sequence()
        scheduled = sections.annotations.get("x-opt-scheduled-enqueue-time")
        if scheduled is not None:
            at = _epoch_seconds(scheduled)
            if at > now:
                self._scheduled_messages[seq] = (sections, at)
                heapq.heappush(self._scheduled, (at, seq))
                return seq
        self.route(seq, sections, now)
        return seq

    def schedule(self, sections: Sections, at: float, now: float) -> int:
        seq = self.next_sequence()
        if at <= now:
            self.route(seq, sections, now)
            return seq
        self._scheduled_messages[seq] = (sections, at)
        heapq.heappush(self._scheduled, (at, seq))
        return seq

    def cancel_scheduled(self, seq: int) -> None:
        if self._scheduled_messages.pop(int(seq), None) is None:
            raise MessageNotFound(f"scheduled message {seq} not found in {self.name}")

    def tick(self, now: float) -> None:
        while self._scheduled and self._scheduled[0][0] <= now:
            _, seq = heapq.heappop(self._scheduled)
            entry = self._scheduled_messages.pop(seq, None)
            if entry is not None:
                self.route(seq, entry[0], now)

    def route(self, seq: int, sections: Sections, now: float) -> None:
        raise NotImplementedError

    def _stored(
        self, seq: int, sections: Sections, now: float, default_ttls: Iterable[float]
    ) -> StoredMessage:
        ttl_ms = sections.header[2]
        limits = [int(t * 1000) for t in default_ttls]
        if ttl_ms is not None and int(ttl_ms) > 0:
            limits.append(int(ttl_ms))
        effective = min(limits) if limits else None
        expires_at = now + effective / 1000 if effective is not None else None
        group_id = sections.properties[10]
        return StoredMessage(
            seq,
            sections,
            now,
            expires_at,
            effective if effective is not None and effective <= MAX_TTL_MS else None,
            None if group_id is None else str(group_id),
        )


def check_size(target: SendTarget, size: int, message_id: Any = None) -> None:
    """Refuse a transfer over the entity's limit as Service Bus does (a batch when
    ``message_id`` is None: the SDK's batch envelope has no message id of its own)."""
    settings = target.settings
    if message_id is None:
        if size > settings.max_batch_size:
            raise MessageSizeExceeded(
                f"The batch (size:{size} bytes) is larger than is currently allowed "
                f"({settings.max_batch_size} bytes) on {target.name!r}."
            )
    elif size > settings.max_message_size:
        raise MessageSizeExceeded(
            f"The message (id:{message_id}, size:{size} bytes) is larger than is currently "
            f"allowed ({settings.max_message_size} bytes) on {target.name!r}."
        )


class Queue(SendTarget):
    def __init__(self, name: str, sending: SenderSettings, receiving: ReceiverSettings) -> None:
        super().__init__(name, sending)
        dlq = MessageStore(f"{name}/$DeadLetterQueue", receiving)
        self.store = MessageStore(name, receiving, dead_letter_queue=dlq)

    def route(self, seq: int, sections: Sections, now: float) -> None:
        ttls = (self.settings.default_ttl, self.store.settings.default_ttl)
        self.store.enqueue(self._stored(seq, sections, now, ttls), now)


@dataclass
class Subscription:
    name: str
    store: MessageStore
    rules: tuple[RuleConfig, ...]

    def wants(self, facts: MessageFacts) -> bool:
        return any(rule.filter.matches(facts) for rule in self.rules)


class Topic(SendTarget):
    def __init__(self, name: str, sending: SenderSettings) -> None:
        super().__init__(name, sending)
        self.subscriptions: dict[str, Subscription] = {}

    def route(self, seq: int, sections: Sections, now: float) -> None:
        facts = message_facts(sections)
        for sub in self.subscriptions.values():
            if sub.wants(facts):
                ttls = (self.settings.default_ttl, sub.store.settings.default_ttl)
                sub.store.enqueue(self._stored(seq, sections, now, ttls), now)


def _epoch_seconds(value: Any) -> float:
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    return int(value) / 1000.0


@dataclass
class Resolved:
    """What an address names: a send target, a message store, or a management node."""

    target: SendTarget | None = None
    store: MessageStore | None = None
    management: bool = False


class Namespace:
    """All entities of one namespace, looked up by AMQP address (case-insensitive)."""

    def __init__(self, config: NamespaceConfig) -> None:
        self.name = config.name
        self.queues: dict[str, Queue] = {}
        self.topics: dict[str, Topic] = {}
        for q in config.queues:
            self.queues[q.name.lower()] = Queue(q.name, q.sending, q.receiving)
        for t in config.topics:
            topic = Topic(t.name, t.sending)
            for s in t.subscriptions:
                path = f"{t.name}/Subscriptions/{s.name}"
                dlq = MessageStore(f"{path}/$DeadLetterQueue", s.receiving)
                store = MessageStore(path, s.receiving, dead_letter_queue=dlq)
                topic.subscriptions[s.name.lower()] = Subscription(s.name, store, s.rules)
            self.topics[t.name.lower()] = topic

    def stores(self) -> Iterable[MessageStore]:
        for q in self.queues.values():
            yield q.store
            if q.store.dead_letter_queue is not None:
                yield q.store.dead_letter_queue
        for t in self.topics.values():
            for sub in t.subscriptions.values():
                yield sub.store
                if sub.store.dead_letter_queue is not None:
                    yield sub.store.dead_letter_queue

    def targets(self) -> Iterable[SendTarget]:
        yield from self.queues.values()
        yield from self.topics.values()

    def resolve(self, address: str | None) -> Resolved:
        path = entity_path(address)
        parts = [p for p in path.split("/") if p]
        management = bool(parts) and parts[-1].lower() == "$management"
        if management:
            parts = parts[:-1]
        lowered = [p.lower() for p in parts]
        dead = bool(lowered) and lowered[-1] == DLQ_SUFFIX
        if dead:
            lowered = lowered[:-1]
        resolved: Resolved | None = None
        if len(lowered) == 1 and lowered[0] in self.queues:
            queue = self.queues[lowered[0]]
            store = queue.store.dead_letter_queue if dead else queue.store
            resolved = Resolved(None if dead else queue, store)
        elif len(lowered) == 1 and lowered[0] in self.topics and not dead:
            resolved = Resolved(self.topics[lowered[0]], None)
        elif len(lowered) == 3 and lowered[1] == "subscriptions" and lowered[0] in self.topics:
            sub = self.topics[lowered[0]].subscriptions.get(lowered[2])
            if sub is not None:
                resolved = Resolved(None, sub.store.dead_letter_queue if dead else sub.store)
        if resolved is None:
            raise EntityNotFound(
                f"The messaging entity '{self.name}:{path}' could not be found. "
                "Entities come from the emulator's Config.json."
            )
        resolved.management = management
        return resolved


def entity_path(address: str | None) -> str:
    """``amqps://host:port/queue`` or ``/queue`` or ``queue`` -> ``queue``."""
    if not address:
        return ""
    text = str(address)
    if "://" in text:
        text = text.split("://", 1)[1]
        text = text.split("/", 1)[1] if "/" in text else ""
    return text.strip("/")
