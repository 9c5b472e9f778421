"""The Service Bus publisher's batching and refusals, with the SDK's own message and batch types
(no network: the sender is a stand-in that takes batches, and can refuse them as too large as a
broker with a lower limit than announced does). The same through the emulator is in
tests/integration/test_forwarder_delivery.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessageBatch
from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusConnectionError
from hypothesis import given, settings
from hypothesis import strategies as st

from sebridge import servicebus
from sebridge.contract.events import (
    Envelope,
    Observer,
    Transition,
    event_message,
    heartbeat_message,
)
from sebridge.forwarder.delivery.publisher import STANDARD_MAX_MESSAGE_BYTES, ServiceBusPublisher
from sebridge.forwarder.ports import MessageRefused, PublishError
from sebridge.imds import ScheduledEvent
from tests.support.budget import examples

NOW = datetime(2026, 11, 22, 1, 0, tzinfo=UTC)


def envelope(i: int, resources: int = 1) -> Envelope:
    event = ScheduledEvent.from_imds(
        {
            "EventId": f"00000000-0000-4000-8000-{i:012d}",
            "EventType": "Reboot",
            "EventStatus": "Scheduled",
            "Resources": [f"vm-{n:04d}".ljust(60, "x") for n in range(resources)],
            "NotBefore": "Mon, 23 Nov 2026 10:00:00 GMT",
        }
    )
    return event_message(Transition.SCHEDULED, event, Observer(vm_name="vm1"), 1, NOW)


def broken(envelope: Envelope, **properties: Any) -> Envelope:
    return Envelope(
        envelope.message_id,
        envelope.session_id,
        envelope.subject,
        {**envelope.application_properties, **properties},
        envelope.body,
    )


class Sender:
    """Stands in for the SDK's topic sender: real batches, a broker limit of its own."""

    def __init__(self, link_max: int = 1024 * 1024, broker_max: int | None = None) -> None:
        self.link_max = link_max
        self.broker_max = broker_max
        self.sent: list[list[str]] = []
        self.fail: Exception | None = None

    def create_message_batch(self, max_size_in_bytes: int | None = None) -> ServiceBusMessageBatch:
        if max_size_in_bytes and max_size_in_bytes > self.link_max:
            raise ValueError(f"Max message size: {max_size_in_bytes} is too large")
        return ServiceBusMessageBatch(max_size_in_bytes=max_size_in_bytes or self.link_max)

    def send_messages(self, message: Any, timeout: float | None = None) -> None:
        if self.fail is not None:
            raise self.fail
        if isinstance(message, ServiceBusMessageBatch):
            size, ids = message.size_in_bytes, [m.message_id for m in message._messages]
        else:
            size, ids = len(str(message)), [message.message_id]
        if self.broker_max is not None and size > self.broker_max:
            raise MessageSizeExceededError(message="the message is larger than allowed")
        self.sent.append(ids)

    def close(self) -> None:
        return None


def publisher(sender: Sender, max_size: int = STANDARD_MAX_MESSAGE_BYTES) -> ServiceBusPublisher:
    out = ServiceBusPublisher("scheduled-events", connection_string="x", max_message_size=max_size)
    out._sender, out._client = sender, sender
    return out


def drain(pub: ServiceBusPublisher, pending: list[Envelope]) -> list[int]:
    counts = []
    while pending:
        count = pub.publish(pending)
        counts.append(count)
        pending = pending[count:]
    return counts


def test_batches_are_filled_until_the_next_message_would_not_fit() -> None:
    sender = Sender()
    messages = [envelope(i, resources=400) for i in range(5)]  # ~25 KB each
    assert drain(publisher(sender, max_size=65536), messages) == [2, 2, 1]
    assert [m for batch in sender.sent for m in batch] == [m.message_id for m in messages]


def test_a_setting_above_the_links_limit_uses_the_links() -> None:
    sender = Sender(link_max=65536)
    messages = [envelope(i, resources=400) for i in range(3)]
    assert drain(publisher(sender, max_size=10 * 2**20), messages) == [2, 1]


def test_a_message_larger_than_the_maximum_even_alone_is_refused() -> None:
    pub = publisher(Sender(), max_size=16384)
    with pytest.raises(MessageRefused, match="larger than the maximum message size"):
        pub.publish([envelope(1, resources=400), envelope(2)])
    assert pub.publish([envelope(2)]) == 1


@pytest.mark.parametrize(
    "breakage",
    [
        {"durationInSeconds": 3_000_000_000},
        {"eventType": "Reboot\ud800"},
        {"resources": 10**30},
    ],
)
def test_a_message_the_sdk_cannot_encode_is_refused_alone_and_ends_a_batch_before_it(
    breakage: dict[str, Any],
) -> None:
    sender = Sender()
    pub = publisher(sender)
    good, bad, after = envelope(1), broken(envelope(2), **breakage), envelope(3)
    assert pub.publish([good, bad, after]) == 1  # what comes before it goes
    with pytest.raises(MessageRefused, match="cannot encode"):
        pub.publish([bad, after])
    assert pub.publish([after]) == 1
    assert sender.sent == [[good.message_id], [after.message_id]]


def test_an_id_over_128_characters_is_refused() -> None:
    bad = envelope(1)
    bad = Envelope("x" * 200, bad.session_id, bad.subject, bad.application_properties, bad.body)
    with pytest.raises(MessageRefused, match="128"):
        publisher(Sender()).publish([bad])


def test_a_broker_with_a_lower_limit_than_announced_gets_one_message_at_a_time() -> None:
    sender = Sender(broker_max=40_000)
    pub = publisher(sender, max_size=65536)
    messages = [envelope(i, resources=400) for i in range(3)]
    assert pub.publish(messages) == 2  # the batch of two refused: each then goes alone
    assert pub.publish(messages[2:]) == 1
    assert sender.sent == [[m.message_id] for m in messages]
    with pytest.raises(MessageRefused, match="refused by Service Bus as too large"):
        pub.publish([envelope(9, resources=900)])  # ~55 KB: too large for this broker alone


def test_broker_and_network_failures_are_retried_not_set_aside() -> None:
    sender = Sender()
    sender.fail = ServiceBusConnectionError(message="connection lost")
    pub = publisher(sender)
    with pytest.raises(PublishError, match="connection lost"):
        pub.publish([envelope(1)])
    assert pub._sender is None  # rebuilt on the next try


# -- every message built from whatever IMDS sends encodes with the real SDK --------------------


odd_text = st.text(st.characters(codec=None, categories=None), max_size=300) | st.just("a\ud800b")
odd_value = st.one_of(
    odd_text,
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.none(),
    st.booleans(),
    st.lists(odd_text, max_size=5),
)
odd_events = st.fixed_dictionaries(
    {"EventId": st.one_of(st.uuids().map(str), odd_text.filter(lambda t: t.strip()))},
    optional={
        "EventType": odd_value,
        "EventStatus": st.sampled_from(["Scheduled", "Started"]) | odd_value,
        "Resources": st.lists(odd_text, max_size=30) | odd_value,
        "NotBefore": odd_value,
        "Description": odd_value,
        "EventSource": odd_value,
        "DurationInSeconds": odd_value,
        "ResourceType": odd_value,
    },
)
observers = st.builds(
    Observer,
    vm_name=odd_text.filter(lambda t: t.strip()),
    resource_group=odd_text,
    subscription_id=odd_text,
    vm_scale_set_name=odd_text,
    resource_id=odd_text,
)


@pytest.mark.slow
@settings(max_examples=examples(1500), deadline=None)
@given(odd_events, observers, st.sampled_from(list(Transition)[:5]))
def test_whatever_imds_sends_makes_a_message_the_sdk_encodes(
    raw: dict[str, Any], observer: Observer, transition: Transition
) -> None:
    event = ScheduledEvent.from_imds(raw, strict=False)
    changes = {"NotBefore": {"from": None, "to": raw.get("NotBefore")}}
    message = event_message(
        transition,
        event,
        observer,
        2**40,
        NOW,
        changes=changes if transition is Transition.UPDATED else None,
    )
    batch = ServiceBusMessageBatch(max_size_in_bytes=16 * 2**20)
    batch.add_message(servicebus.envelope_message(message))  # the SDK's own AMQP encoding
    assert len(message.message_id) <= 128 and len(message.session_id) <= 128
    beat = heartbeat_message(
        observer,
        NOW,
        forwarder_version="t",
        last_incarnation=2**70,
        outbox_depth=0,
        last_successful_poll=None,
        health={"lastError": raw.get("Description")},
    )
    batch.add_message(servicebus.envelope_message(beat))
