"""Behaviours where the local emulator used to differ from Service Bus.

Each was found by running azure-servicebus's own test suite against the emulator (make
peer-suite); each test here states what Service Bus does, through the real SDK, so it runs
unchanged against a real namespace.
"""

from __future__ import annotations

import time
import uuid
from decimal import Decimal

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.amqp import AmqpAnnotatedMessage, AmqpMessageBodyType
from azure.servicebus.exceptions import ServiceBusError

QUEUE = "contract-queue"
SESSION_QUEUE = "contract-sessions"


@pytest.mark.timeout(60)
def test_message_without_session_id_to_a_session_queue_is_refused_at_once(
    client: ServiceBusClient,
) -> None:
    """Service Bus rejects the transfer (amqp:not-allowed, with its usual error info); the SDK
    raises at once. An error without ``info`` made the SDK wait out its send timeout."""
    with client.get_queue_sender(SESSION_QUEUE) as sender:
        started = time.monotonic()
        with pytest.raises(ServiceBusError, match="SessionId"):
            sender.send_messages(ServiceBusMessage("no session"), timeout=30)
        assert time.monotonic() - started < 5
        # the link is still usable: a message with a session id goes through
        sender.send_messages(ServiceBusMessage("with session", session_id=f"s-{uuid.uuid4()}"))


@pytest.mark.timeout(30)
def test_value_body_map_with_binary_keys_round_trips(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    body = {b"binary-key": b"v", "text": [b"a", {b"nested": 1}], b"\x00\xff": None}
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(AmqpAnnotatedMessage(value_body=body), timeout=10)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert got.body_type == AmqpMessageBodyType.VALUE
        assert got.body == {b"binary-key": b"v", b"text": [b"a", {b"nested": 1}], b"\x00\xff": None}
        receiver.complete_message(got)


@pytest.mark.timeout(30)
def test_decimal_application_properties_arrive_as_decimals(client: ServiceBusClient, drain) -> None:
    """Service Bus re-encodes decimal properties in the layout the SDK decodes; the client's own
    IEEE encoding comes back undecodable and the SDK drops the message (in receive-and-delete
    mode it is then lost)."""
    drain(QUEUE)
    properties = {"price": Decimal("1.2345"), "delta": Decimal("-7.5"), "whole": Decimal("12")}
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("priced", application_properties=properties))
        sender.send_messages(ServiceBusMessage("priced-2", application_properties=properties))
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=5
    ) as receiver:
        got = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        if len(got) < 2:
            got += receiver.receive_messages(max_message_count=1, max_wait_time=2)
        assert [str(m) for m in got] == ["priced", "priced-2"]
        for message in got:
            props = {k.decode(): v for k, v in message.application_properties.items()}
            assert props == properties


@pytest.mark.timeout(30)
def test_decimal_property_survives_dead_lettering(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    drain(QUEUE, dead_letter=True)
    marker = f"dlq-decimal-{uuid.uuid4()}"
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            ServiceBusMessage(
                "x", message_id=marker, application_properties={"amount": Decimal("0.25")}
            )
        )
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.dead_letter_message(got, reason="bad-amount")
    with client.get_queue_receiver(QUEUE, sub_queue="deadletter", max_wait_time=5) as receiver:
        (dead,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert dead.message_id == marker
        assert dead.application_properties[b"amount"] == Decimal("0.25")
        assert dead.dead_letter_reason == "bad-amount"
        receiver.complete_message(dead)


@pytest.mark.timeout(30)
def test_peek_lock_delivery_carries_its_lock_token_in_delivery_annotations(
    client: ServiceBusClient, drain
) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("annotated"))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        annotations = got.raw_amqp_message.delivery_annotations or {}
        token = annotations.get(b"x-opt-lock-token")
        assert token is not None
        assert str(token) == str(got.lock_token)
        receiver.complete_message(got)
