"""Sending and receiving through the real SDK: properties, body types, lists and batches."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusAuthenticationError

QUEUE = "contract-queue"


@pytest.mark.timeout(30)
def test_every_message_property_round_trips(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    message_id = f"props-{uuid.uuid4()}"
    sent = ServiceBusMessage(
        b'{"hello": "world"}',
        message_id=message_id,
        session_id=None,
        subject="Scheduled",
        content_type="application/json",
        correlation_id="corr-42",
        reply_to="replies",
        reply_to_session_id="reply-session",
        to="someone",
        time_to_live=dt.timedelta(minutes=5),
        application_properties={"vmName": "vm-1", "count": 3, "ratio": 0.5, "flag": True},
        partition_key=None,
    )
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=2)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert str(got) == '{"hello": "world"}'
        assert got.message_id == message_id
        assert got.subject == "Scheduled"
        assert got.content_type == "application/json"
        assert got.correlation_id == "corr-42"
        assert got.reply_to == "replies"
        assert got.reply_to_session_id == "reply-session"
        assert got.to == "someone"
        assert got.time_to_live == dt.timedelta(minutes=5)
        props = {k.decode(): v for k, v in got.application_properties.items()}
        assert props["vmName"] in (b"vm-1", "vm-1")
        assert props["count"] == 3
        assert props["ratio"] == 0.5
        assert props["flag"] is True
        # set by the broker
        assert got.sequence_number is not None and got.sequence_number > 0
        assert got.enqueued_time_utc is not None and got.enqueued_time_utc >= before
        assert got.locked_until_utc is not None and got.locked_until_utc > got.enqueued_time_utc
        assert got.delivery_count == 0
        assert got.expires_at_utc == got.enqueued_time_utc + dt.timedelta(minutes=5)
        assert got.lock_token is not None
        receiver.complete_message(got)


@pytest.mark.timeout(30)
def test_partition_key_and_session_free_message_round_trip(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("pk", partition_key="pk-1", message_id="pk-msg"))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_wait_time=5)
        assert got.partition_key == "pk-1"
        assert got.session_id is None
        receiver.complete_message(got)


@pytest.mark.timeout(30)
def test_body_types_value_sequence_and_multi_data(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    value = AmqpAnnotatedMessage(value_body={"answer": 42, "list": [1, 2]})
    sequence = AmqpAnnotatedMessage(sequence_body=[[1, 2, 3], ["a", "b"]])
    data = AmqpAnnotatedMessage(data_body=[b"part-1", b"part-2"])
    large = bytes(range(256)) * 800  # 200 KiB: several AMQP frames, within the Standard tier limit
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(value)
        sender.send_messages(sequence)
        sender.send_messages(data)
        sender.send_messages(ServiceBusMessage(large))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        got = _receive(receiver, 4)
        assert b"".join(got[3].body) == large
        assert got[0].body_type == AmqpMessageBodyType.VALUE
        assert got[0].body == {b"answer": 42, b"list": [1, 2]}
        assert got[1].body_type == AmqpMessageBodyType.SEQUENCE
        assert list(got[1].body) == [[1, 2, 3], [b"a", b"b"]]
        assert got[2].body_type == AmqpMessageBodyType.DATA
        assert list(got[2].body) == [b"part-1", b"part-2"]
        for message in got:
            receiver.complete_message(message)


@pytest.mark.timeout(30)
def test_list_and_batch_keep_order_and_properties(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"list-{i}", application_properties={"i": i}) for i in range(5)]
        )
        batch = sender.create_message_batch()
        for i in range(5):
            batch.add_message(ServiceBusMessage(f"batch-{i}", message_id=f"batch-{i}"))
        sender.send_messages(batch)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        got = _receive(receiver, 10)
        bodies = [str(m) for m in got]
        assert bodies == [f"list-{i}" for i in range(5)] + [f"batch-{i}" for i in range(5)]
        assert [m.application_properties[b"i"] for m in got[:5]] == list(range(5))
        assert [m.message_id for m in got[5:]] == [f"batch-{i}" for i in range(5)]
        seqs = [m.sequence_number for m in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == 10
        for message in got:
            receiver.complete_message(message)


@pytest.mark.timeout(30)
def test_receive_and_delete_removes_the_message(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("once"))
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
    ) as receiver:
        (got,) = receiver.receive_messages(max_wait_time=5)
        assert str(got) == "once"
        assert got.lock_token is None
        assert receiver.receive_messages(max_wait_time=0.5) == []
        assert receiver.peek_messages(max_message_count=10) == []  # gone, not just locked


@pytest.mark.timeout(30)
def test_unknown_entity_is_refused_promptly_at_put_token(client: ServiceBusClient) -> None:
    """Service Bus answers the put-token for a missing entity with 404 ("The messaging entity
    ... could not be found"), so the SDK raises ServiceBusAuthenticationError (its own tests:
    test_sb_client_bad_entity, test_session_connection_failure_is_idempotent)."""
    started = time.monotonic()
    with pytest.raises(ServiceBusAuthenticationError) as refused:
        with client.get_queue_sender("no-such-queue") as sender:
            sender.send_messages(ServiceBusMessage("x"))
    assert "404" in refused.value.exc_msg and "could not be found" in refused.value.exc_msg
    with pytest.raises(ServiceBusAuthenticationError) as refused:
        with client.get_queue_receiver("no-such-queue", max_wait_time=1) as receiver:
            receiver.receive_messages(max_wait_time=1)
    assert "404" in refused.value.exc_msg
    assert time.monotonic() - started < 10


@pytest.mark.timeout(30)
def test_unknown_subscription_is_refused_at_put_token(client: ServiceBusClient) -> None:
    with pytest.raises(ServiceBusAuthenticationError) as refused:
        with client.get_subscription_receiver("contract-topic", "nope", max_wait_time=1) as r:
            r.receive_messages(max_wait_time=1)
    assert "404" in refused.value.exc_msg


def _receive(receiver, count: int, timeout: float = 10.0) -> list:
    """Receive exactly ``count`` messages (bounded in time)."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += receiver.receive_messages(max_message_count=count - len(got), max_wait_time=2)
    assert len(got) == count, f"expected {count} messages, got {len(got)}"
    return got
