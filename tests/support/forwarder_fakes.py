"""In-memory stand-ins for the ports of the forwarder's loop, each with the faults a VM sees.

The loop under test is the real :class:`sebridge.forwarder.service.Forwarder`; what is faked is
only what it touches: IMDS (a document the test sets), the clock, the state file, the outbox
(the real SQLite outbox in memory, with write failures injected in front of it) and Service Bus
(a broker with duplicate detection). "Disk" is what survives a crash: the store's last saved
bytes and the outbox database; :func:`restart` builds a new forwarder from them alone.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sebridge.contract.events import Envelope, Observer
from sebridge.forwarder.delivery.outbox import MEMORY, Outbox, OutboxError
from sebridge.forwarder.ports import ImdsError, MessageRefused, PublishError
from sebridge.forwarder.service import Forwarder
from sebridge.forwarder.state import ForwarderState
from sebridge.imds import Document, InvalidDocument

# What instance metadata answers: an identity names a vmId and a resource id (is_identity).
OBSERVER = Observer(
    vm_name="vm1",
    vm_id="6b1d7c55-0000-4000-8000-0000000000f1",
    resource_id="/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/"
    "virtualMachines/vm1",
    resource_group="rg",
    subscription_id="sub",
)
T0 = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, start: datetime = T0) -> None:
        self.wall = start
        self.mono = 1000.0

    def monotonic(self) -> float:
        return self.mono

    def now(self) -> datetime:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += timedelta(seconds=seconds)


class FakeImds:
    """Serves ``events`` (IMDS JSON objects) as the document; fails the next ``fail_next``
    polls; instance metadata answers OBSERVER or raises ``instance_error``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.incarnation = 1
        self.fail_next = 0
        self.instance_error: ImdsError | None = None
        self.instance_answer: Observer | None = None  # answered instead of OBSERVER when set
        self.gets = 0
        self.lookups: list[float] = []  # when instance metadata was asked (set by the test's clock)
        self.clock: FakeClock | None = None

    def set(self, events: Sequence[dict[str, Any]]) -> None:
        self.events = [dict(e) for e in events]
        self.incarnation += 1

    def get_document(self) -> Document:
        self.gets += 1
        if self.fail_next:
            self.fail_next -= 1
            raise ImdsError("IMDS answered 500 (injected)", transient=True)
        try:
            return Document.from_imds(
                {"DocumentIncarnation": self.incarnation, "Events": list(self.events)}
            )
        except InvalidDocument as exc:
            raise ImdsError(f"not a valid document: {exc}", transient=True) from exc

    def instance_metadata(self) -> Observer:
        if self.clock is not None:
            self.lookups.append(self.clock.monotonic())
        if self.instance_error is not None:
            raise self.instance_error
        return OBSERVER if self.instance_answer is None else self.instance_answer


class FakeStore:
    """The state file: the bytes of the last successful save are what is on disk."""

    def __init__(self) -> None:
        self.disk: bytes | None = None
        self.fail_next = 0
        self.saves = 0
        self.failures = 0

    def load(self) -> ForwarderState:
        if self.disk is None:
            return ForwarderState()
        return ForwarderState.from_json(json.loads(self.disk))

    def save(self, state: ForwarderState) -> None:
        if self.fail_next:
            self.fail_next -= 1
            self.failures += 1
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        self.disk = json.dumps(state.to_json()).encode()
        self.saves += 1


class FaultyOutbox:
    """The real outbox (SQLite in memory: it outlives a crash of the forwarder, as the file
    does) behind writes that fail ``fail_writes`` times (a full disk)."""

    def __init__(self, max_rows: int = 100_000) -> None:
        self.real = Outbox(MEMORY, max_rows=max_rows)
        self.fail_writes = 0
        self.put_failures = 0
        self.release_failures = 0

    def _maybe_fail(self) -> None:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OutboxError("OperationalError: database or disk is full (injected)")

    def put(self, envelopes: Sequence[Envelope], *, hold: bool = False) -> int:
        try:
            self._maybe_fail()
        except OutboxError:
            self.put_failures += 1
            raise
        return self.real.put(envelopes, hold=hold)

    def release(self, up_to: int) -> None:
        try:
            self._maybe_fail()
        except OutboxError:
            self.release_failures += 1
            raise
        self.real.release(up_to)

    def recover(self, saved_up_to: int) -> tuple[int, int]:
        return self.real.recover(saved_up_to)

    def peek(self, limit: int) -> list[tuple[int, Envelope]]:
        return self.real.peek(limit)

    def remove(self, seqs: Sequence[int]) -> None:
        self.real.remove(seqs)

    def set_aside(self, seq: int, reason: str) -> None:
        self.real.set_aside(seq, reason)

    def aside_count(self) -> int:
        return self.real.aside_count()

    def depth(self) -> int:
        return self.real.depth()

    def held(self) -> int:
        (count,) = self.real._db.execute("SELECT COUNT(*) FROM outbox WHERE ready = 0").fetchone()
        return int(count)


@dataclass
class FakeBroker:
    """A topic with duplicate detection: ``accepted`` holds each message id once, in order.

    Faults: ``fail_next`` transient failures; ``lose_ack_next`` sends that reach the broker but
    whose success the sender never hears of; ``refuse`` says which messages can never be sent
    (the publisher's MessageRefused); ``batch`` is how many one call sends at most."""

    batch: int = 3
    fail_next: int = 0
    lose_ack_next: int = 0
    refuse: Callable[[Envelope], str | None] = lambda _: None
    accepted: list[Envelope] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    calls: int = 0

    def connect(self) -> None:
        return None

    def publish(self, envelopes: Sequence[Envelope]) -> int:
        self.calls += 1
        if self.fail_next:
            self.fail_next -= 1
            raise PublishError("ServiceBusConnectionError: broker down (injected)")
        taken = 0
        for envelope in envelopes[: self.batch]:
            reason = self.refuse(envelope)
            if reason is not None:
                if taken == 0:
                    raise MessageRefused(reason)
                break
            taken += 1
        for envelope in envelopes[:taken]:
            if envelope.message_id not in self.ids:
                self.ids.add(envelope.message_id)
                self.accepted.append(envelope)
        if self.lose_ack_next:
            self.lose_ack_next -= 1
            raise PublishError("OperationTimeoutError: no answer to the send (injected)")
        return taken

    def close(self) -> None:
        return None

    def transitions(self) -> list[Envelope]:
        return [e for e in self.accepted if e.subject != "Heartbeat"]

    def heartbeats(self) -> list[Envelope]:
        return [e for e in self.accepted if e.subject == "Heartbeat"]


@dataclass
class World:
    """Everything outside the forwarder process, and the forwarder of the moment."""

    clock: FakeClock = field(default_factory=FakeClock)
    imds: FakeImds = field(default_factory=FakeImds)
    store: FakeStore = field(default_factory=FakeStore)
    outbox: FaultyOutbox = field(default_factory=FaultyOutbox)
    broker: FakeBroker = field(default_factory=FakeBroker)
    heartbeat_interval: float = 0.0
    # The forwarder's identity from the host name, while instance metadata fails.
    host_name: str = "fallback"
    forwarder: Forwarder = field(init=False)

    def __post_init__(self) -> None:
        self.imds.clock = self.clock
        self.forwarder = self.start()

    def start(self) -> Forwarder:
        forwarder = Forwarder(
            imds=self.imds,
            store=self.store,
            outbox=self.outbox,
            publisher=self.broker,
            clock=self.clock,
            poll_interval=1.0,
            heartbeat_interval=self.heartbeat_interval,
            fallback_observer=lambda: Observer(vm_name=self.host_name),
        )
        forwarder.resolve_observer()
        return forwarder

    def restart(self) -> Forwarder:
        """A crash (kill -9, power loss): a new forwarder from what is on disk."""
        self.forwarder = self.start()
        return self.forwarder


def scheduled(event_id: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "EventId": event_id,
        "EventType": "Reboot",
        "ResourceType": "VirtualMachine",
        "Resources": ["vm1"],
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 23 Nov 2026 10:00:00 GMT",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }
    return base | fields


def started(event_id: str, **fields: Any) -> dict[str, Any]:
    return scheduled(event_id, EventStatus="Started", NotBefore="") | fields
