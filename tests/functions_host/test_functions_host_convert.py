"""SDK received message -> azure.functions.ServiceBusMessage, through the package's converter.

The received messages are decoded by azure-servicebus from AMQP bytes that Qpid Proton (an
independent AMQP implementation) encoded, with the broker annotations a real broker adds.
"""

from __future__ import annotations

import datetime as dt

from azure.servicebus import ServiceBusReceivedMessage
from proton import Message, symbol, timestamp

from emulators.functions_host.convert import to_function_message, to_function_messages

ENQUEUED_MS = 1_700_000_000_000


def _received(
    body: bytes, *, message_id: str, sequence: int = 42, **extra: object
) -> ServiceBusReceivedMessage:
    message = Message(
        body=body,
        inferred=True,  # bytes go in a data section, as Service Bus senders write them
        id=message_id,
        correlation_id="corr-1",
        subject="Scheduled",
        reply_to="replies",
        reply_to_group_id="reply-session",
        address="to-x",
        group_id="session-1",
        content_type="application/json",
        ttl=8 * 86400,  # longer than a day: the converter's H:M:S format cannot hold it
        delivery_count=2,
        properties={"transition": "Scheduled", "durationInSeconds": 5, "flag": True},
        annotations={
            symbol("x-opt-sequence-number"): sequence,
            symbol("x-opt-enqueued-time"): timestamp(ENQUEUED_MS),
            symbol("x-opt-locked-until"): timestamp(ENQUEUED_MS + 60_000),
            symbol("x-opt-partition-key"): "pk",
            symbol("x-opt-enqueue-sequence-number"): sequence - 1,
            symbol("x-opt-scheduled-enqueue-time"): timestamp(ENQUEUED_MS),
            symbol("x-opt-deadletter-source"): "orig-sub",
        },
        **extra,
    )
    return ServiceBusReceivedMessage.from_bytes(bytes(message.encode()))


def test_every_field_reaches_the_function_message() -> None:
    enqueued = dt.datetime.fromtimestamp(ENQUEUED_MS / 1000, dt.UTC)
    msg = to_function_message(_received(b'{"a": 1}', message_id="m-1"), function_name="capture")

    assert msg.get_body() == b'{"a": 1}'
    assert msg.message_id == "m-1"
    assert msg.session_id == "session-1"
    assert msg.correlation_id == "corr-1"
    assert msg.subject == msg.label == "Scheduled"
    assert msg.reply_to == "replies"
    assert msg.reply_to_session_id == "reply-session"
    assert msg.to == "to-x"
    assert msg.content_type == "application/json"
    assert msg.time_to_live == dt.timedelta(days=8)
    assert msg.delivery_count == 3  # two earlier attempts (AMQP header) + this one, as .NET counts
    assert msg.sequence_number == 42
    assert msg.enqueued_sequence_number == 41
    assert msg.enqueued_time_utc == enqueued
    assert msg.expires_at_utc == enqueued + dt.timedelta(days=8)
    assert msg.locked_until == enqueued + dt.timedelta(seconds=60)
    assert msg.scheduled_enqueue_time_utc == enqueued
    assert msg.partition_key == "pk"
    assert msg.dead_letter_source == "orig-sub"
    assert msg.state == 0
    expected_props = {"transition": "Scheduled", "durationInSeconds": 5, "flag": True}
    assert msg.application_properties == expected_props
    assert msg.user_properties == expected_props
    metadata = msg.metadata
    assert metadata is not None
    assert metadata["MessageId"] == "m-1" and metadata["sys"]["MethodName"] == "capture"


def test_session_lock_time_overrides_the_message_lock() -> None:
    session_lock = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    msg = to_function_message(
        _received(b"x", message_id="m"), function_name="f", locked_until=session_lock
    )
    assert msg.locked_until == session_lock


def test_cardinality_many_builds_one_message_per_received_message() -> None:
    received = [
        _received(f"body-{i}".encode(), message_id=f"m-{i}", sequence=10 + i) for i in range(3)
    ]
    messages = to_function_messages(received, function_name="batch")
    assert [m.get_body() for m in messages] == [b"body-0", b"body-1", b"body-2"]
    assert [m.message_id for m in messages] == ["m-0", "m-1", "m-2"]
    assert [m.sequence_number for m in messages] == [10, 11, 12]
    assert messages[1].time_to_live == dt.timedelta(days=8)
    assert messages[2].user_properties["transition"] == "Scheduled"


def test_value_body_is_presented_as_bytes() -> None:
    message = Message(body="text in an amqp-value", id="v-1")
    received = ServiceBusReceivedMessage.from_bytes(bytes(message.encode()))
    assert to_function_message(received, function_name="f").get_body() == b"text in an amqp-value"
