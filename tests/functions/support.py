"""Helpers for the workflow tests: recording Service Bus fakes, message builders, settings."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.functions.servicebus import ServiceBusMessage

from emulators.fakes.arm import FakeArm
from emulators.fakes.storage import FakeBlobStorage
from emulators.fakes.teams import FakeTeams
from functions.shared.ports import VmRecord
from functions.shared.scope import Scope
from functions.shared.verified import VerifiedMessage
from sebridge import lifecycle
from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope, Transition, TransitionMessage, event_message
from sebridge.imds import Document, ScheduledEvent
from tests.fixtures import golden

SUB = golden.SUBSCRIPTION
RG = "rg-web"
NOW = datetime(2026, 11, 22, 1, 21, 0, tzinfo=UTC)  # a minute after the golden observations
SIGNING_KEY = "test-signing-key-0123456789-abcdefghijklmnop"
EVENT_ID = golden.EVENT_ID.lower()
AVAILABILITY_SET = "as-web"
POOL_CONTAINER = "sebridge-pools"


AVAILABILITY_SET_ID = (
    f"/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/"
    f"availabilitySets/{AVAILABILITY_SET}"
)


def web_vm(arm: FakeArm, name: str, pools: list[str], **options: Any) -> str:
    """A VM of the golden world: in rg-web, in the availability set as-web with the observer
    web-1 (whose vmId is the golden observer's), so that web-1's messages may name it."""
    availability_set = arm.add_availability_set(SUB, RG, AVAILABILITY_SET)
    if name == golden.OBSERVER.vm_name:
        options.setdefault("vm_id", golden.OBSERVER.vm_id)
    return arm.add_vm(SUB, RG, name, pools, availability_set=availability_set, **options)


@dataclass
class RecordingCommands:
    sent: list[tuple[ApproveCommand, str]] = field(default_factory=list)

    def send(self, command: ApproveCommand, session_id: str) -> None:
        self.sent.append((command, session_id))


@dataclass
class RecordingPublisher:
    published: list[Envelope] = field(default_factory=list)

    def publish(self, envelope: Envelope) -> None:
        self.published.append(envelope)


@dataclass
class Clock:
    now: datetime = NOW

    def __call__(self) -> datetime:
        return self.now


def base_env(
    teams: FakeTeams, arm: FakeArm, storage: FakeBlobStorage | None = None
) -> dict[str, str]:
    pools = {"LB_POOL_STATE_URL": storage.container_url(POOL_CONTAINER)} if storage else {}
    return {
        **pools,
        "ServiceBusConnection__fullyQualifiedNamespace": "sebridge-test.servicebus.windows.net",
        "TopicName": "scheduled-events",
        "TeamsSubscriptionName": "teams",
        "LbPoolsSubscriptionName": "lb-pools",
        "ApprovalGateSubscriptionName": "approval-gate",
        "ApprovalsQueueName": "approvals",
        "TEAMS_WEBHOOK_URL": teams.webhook_url,
        "APPROVAL_SIGNING_KEY": SIGNING_KEY,
        "APPROVAL_BASE_URL": "http://127.0.0.1:7071",
        "ARM_ENDPOINT": arm.url,
    }


def sb_message(
    envelope: Envelope, *, body: bytes | None = None, delivery_count: int = 1
) -> ServiceBusMessage:
    """The message as the Functions worker hands it to a Service Bus trigger (its own class)."""
    return ServiceBusMessage(
        body=envelope.body_bytes() if body is None else body,
        message_id=envelope.message_id,
        session_id=envelope.session_id,
        content_type=envelope.content_type,
        label=envelope.subject,
        subject=envelope.subject,
        application_properties=dict(envelope.application_properties),
        user_properties=dict(envelope.application_properties),
        delivery_count=delivery_count,
        enqueued_time_utc=NOW - timedelta(seconds=1),
    )


def event(**fields: Any) -> ScheduledEvent:
    """The golden Scheduled event with some IMDS fields replaced."""
    raw = {**golden.SCHEDULED, **fields}
    return Document.from_imds({"DocumentIncarnation": 11, "Events": [raw]}).events[0]


def envelope(transition: str, observer: Any = None, **fields: Any) -> Envelope:
    """A contract message for the golden event with some IMDS fields replaced."""
    kind = Transition(transition)
    changes = {"NotBefore": {"from": "a", "to": "b"}} if kind is Transition.UPDATED else None
    approval = {"requestedBy": "x", "reason": "y"} if kind is Transition.APPROVED else None
    return event_message(
        kind,
        event(**fields),
        observer or golden.OBSERVER,
        11,
        golden.OBSERVED_AT,
        changes=changes,
        approval=approval,
    )


@dataclass
class App:
    functions: dict[str, Any]  # name -> azure.functions Function
    commands: RecordingCommands
    publisher: RecordingPublisher
    clock: Clock
    teams: FakeTeams
    arm: FakeArm
    storage: FakeBlobStorage | None = None
    scheduler: RecordingScheduler | None = None  # with DrainMomentsQueueName

    def call(self, name: str, *args: Any) -> Any:
        return self.functions[name].get_user_function()(*args)

    def deliver(self, name: str, message: Envelope, *, delivery_count: int = 1) -> Any:
        return self.call(name, sb_message(message, delivery_count=delivery_count))

    def fire_due(self) -> int:
        """Deliver the drain moments due at the clock's time to drain_moment; how many."""
        assert self.scheduler is not None, "make_app(DrainMomentsQueueName=...)"
        ready = self.scheduler.due(self.clock.now)
        for entry in ready:
            self.call("drain_moment", due_message(entry))
        return len(ready)


def at_once(*calls: Callable[[], object]) -> list[BaseException]:
    """Run the calls in threads that start together; the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], object]) -> None:
        try:
            barrier.wait(timeout=10)
            call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    return errors


def as_verified(
    message: TransitionMessage, *, availability_set: str = AVAILABILITY_SET_ID
) -> VerifiedMessage:
    """``message`` as the trigger layer hands it over once it passed the scope check, with the
    observer in ``availability_set`` (for tests of pure cores that need no ARM)."""
    observer = VmRecord(
        id=message.observer.resource_id or f"/subscriptions/{SUB}/vm",
        name=message.observer.vm_name,
        vm_id=message.observer.vm_id,
        nic_ids=(),
        availability_set=availability_set.lower(),
    )
    return VerifiedMessage(message, Scope(observer, ()))


def pagerduty_dedup_key(event_id: str = EVENT_ID, placement: str = AVAILABILITY_SET_ID) -> str:
    """The PagerDuty dedup key of an event observed in ``placement`` (an availability set's,
    scale set's or VM's ARM id): the webhooks preset's, worked out independently."""
    digest = hashlib.sha256(placement.lower().encode("utf-8")).hexdigest()[:16]
    return f"sebridge:{lifecycle.event_ref(event_id)}:{digest}"


@dataclass
class Scheduled:
    """One message lb-pools scheduled on the drain-moments queue."""

    sequence: int
    body: bytes
    at: datetime
    message_id: str


@dataclass
class RecordingScheduler:
    """The drain-moments queue, with the test's clock: what is scheduled and cancelled; the
    messages that are due at a time (the broker's own behaviour is tested against the Service
    Bus emulator, tests/contract and tests/e2e)."""

    pending: dict[int, Scheduled] = field(default_factory=dict)
    cancelled: list[int] = field(default_factory=list)
    scheduled: list[Scheduled] = field(default_factory=list)
    _next: int = 1

    def schedule(self, body: bytes, at: datetime, message_id: str) -> int:
        entry = Scheduled(self._next, body, at, message_id)
        self._next += 1
        self.pending[entry.sequence] = entry
        self.scheduled.append(entry)
        return entry.sequence

    def cancel(self, sequence: int) -> None:
        self.cancelled.append(sequence)
        self.pending.pop(sequence, None)

    def due(self, now: datetime) -> list[Scheduled]:
        """The messages the broker enqueues by ``now`` (taken off the schedule), by time."""
        ready = sorted(
            (e for e in self.pending.values() if e.at <= now), key=lambda e: (e.at, e.sequence)
        )
        for entry in ready:
            del self.pending[entry.sequence]
        return ready


def due_message(entry: Scheduled) -> ServiceBusMessage:
    """A drain-moments message as the Functions worker hands it to the queue trigger."""
    return ServiceBusMessage(
        body=entry.body,
        message_id=entry.message_id,
        content_type="application/json",
        application_properties={},
        user_properties={},
        delivery_count=1,
        enqueued_time_utc=entry.at,
    )
