"""Peek-lock settlement, lock expiry, max delivery count and dead-letter queues."""

from __future__ import annotations

import datetime as dt
import time
import uuid
from contextlib import ExitStack

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSubQueue
from azure.servicebus.exceptions import MessageLockLostError, ServiceBusError

QUEUE = "contract-queue"  # LockDuration PT5S, MaxDeliveryCount 3
SHORT = "contract-short-lock"  # LockDuration PT5S (Azure's shortest), MaxDeliveryCount 2
ONE_DELIVERY = "contract-one-delivery"  # LockDuration PT5S, MaxDeliveryCount 1
LOCK_WAIT = 5.5  # past a PT5S lock


def _one(receiver, wait: float = 5):
    got = receiver.receive_messages(max_message_count=1, max_wait_time=wait)
    assert len(got) == 1, "expected one message"
    return got[0]


@pytest.mark.timeout(30)
def test_complete_removes_and_abandon_redelivers_with_count(
    client: ServiceBusClient, drain
) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("abandon-me", message_id="abandon-me"))
    with client.get_queue_receiver(QUEUE) as receiver:
        first = _one(receiver)
        assert first.delivery_count == 0
        receiver.abandon_message(first)
        second = _one(receiver)
        assert second.message_id == "abandon-me"
        assert second.delivery_count == 1
        assert second.sequence_number == first.sequence_number
        receiver.complete_message(second)
        assert receiver.receive_messages(max_wait_time=0.5) == []
        assert receiver.peek_messages(max_message_count=5) == []


@pytest.mark.timeout(30)
def test_dead_letter_with_reason_and_description(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    drain(QUEUE, dead_letter=True)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            ServiceBusMessage("poison", message_id="poison", application_properties={"k": "v"})
        )
    with client.get_queue_receiver(QUEUE) as receiver:
        message = _one(receiver)
        receiver.dead_letter_message(message, reason="BadInput", error_description="not JSON")
        assert receiver.receive_messages(max_wait_time=0.5) == []
    with client.get_queue_receiver(QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        dead = _one(dlq)
        assert str(dead) == "poison"
        assert dead.message_id == "poison"
        assert dead.dead_letter_reason == "BadInput"
        assert dead.dead_letter_error_description == "not JSON"
        assert dead.application_properties[b"k"] == b"v"
        assert dead.sequence_number == message.sequence_number
        dlq.complete_message(dead)


@pytest.mark.timeout(30)
def test_defer_then_receive_deferred_and_settle(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("later", message_id="later"))
    with client.get_queue_receiver(QUEUE) as receiver:
        message = _one(receiver)
        seq = message.sequence_number
        receiver.defer_message(message)
        assert receiver.receive_messages(max_wait_time=0.5) == []
        (deferred,) = receiver.receive_deferred_messages([seq])
        assert str(deferred) == "later"
        assert deferred.sequence_number == seq
        assert deferred.lock_token is not None
        receiver.renew_message_lock(deferred)
        receiver.complete_message(deferred)
        with pytest.raises(ServiceBusError):
            receiver.receive_deferred_messages([seq])


@pytest.mark.timeout(30)
def test_renew_lock_extends_locked_until(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("renew"))
    with client.get_queue_receiver(QUEUE) as receiver:
        message = _one(receiver)
        before = message.locked_until_utc
        assert before is not None
        time.sleep(0.2)
        after = receiver.renew_message_lock(message)
        assert after > before
        assert message.locked_until_utc == after
        receiver.complete_message(message)


@pytest.mark.slow
@pytest.mark.timeout(40)
def test_lock_expiry_redelivers_then_dead_letters_at_max_delivery_count(
    client: ServiceBusClient, drain
) -> None:
    """A lock that runs out counts as a delivery, like an abandon. One lock wait serves both
    queues: with MaxDeliveryCount 2 the message comes back with delivery_count 1; with
    MaxDeliveryCount 1 that first expiry sends it to the dead-letter queue."""
    drain(SHORT)
    drain(ONE_DELIVERY)
    drain(ONE_DELIVERY, dead_letter=True)
    marker = f"slow-{uuid.uuid4()}"
    for queue in (SHORT, ONE_DELIVERY):
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(ServiceBusMessage("slow", message_id=marker))
    with (
        client.get_queue_receiver(SHORT) as short,
        client.get_queue_receiver(ONE_DELIVERY) as once,
    ):
        first = _one(short)
        only = _one(once)
        locked_at = time.monotonic()
        assert first.delivery_count == only.delivery_count == 0
        # opened while the locks run out (opening a link takes the SDK about half a second)
        with client.get_queue_receiver(
            ONE_DELIVERY, sub_queue=ServiceBusSubQueue.DEAD_LETTER
        ) as dlq:
            time.sleep(max(0.0, locked_at + LOCK_WAIT - time.monotonic()))
            with pytest.raises(MessageLockLostError):
                short.complete_message(first)
            with pytest.raises(MessageLockLostError):
                once.complete_message(only)
            second = _one(short)
            assert second.message_id == marker
            assert second.delivery_count == 1
            assert second.lock_token != first.lock_token
            short.complete_message(second)
            # (Azure moves it to the dead-letter queue when it would deliver it again.)
            assert once.receive_messages(max_wait_time=0.5) == []
            dead = _one(dlq)
            assert dead.message_id == marker
            assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
            dlq.complete_message(dead)


@pytest.mark.timeout(30)
def test_abandon_until_max_delivery_count(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    drain(QUEUE, dead_letter=True)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("retry-me", message_id="retry-me"))
    with client.get_queue_receiver(QUEUE) as receiver:
        for attempt in range(3):  # MaxDeliveryCount 3
            message = _one(receiver)
            assert message.delivery_count == attempt
            receiver.abandon_message(message)
        assert receiver.receive_messages(max_wait_time=0.5) == []
    with client.get_queue_receiver(QUEUE, sub_queue=ServiceBusSubQueue.DEAD_LETTER) as dlq:
        dead = _one(dlq)
        assert dead.message_id == "retry-me"
        assert dead.dead_letter_reason == "MaxDeliveryCountExceeded"
        dlq.complete_message(dead)


@pytest.mark.timeout(30)
def test_ttl_expiry_dead_letters_only_where_configured(client: ServiceBusClient, drain) -> None:
    """contract-ttl dead-letters on expiration, contract-ttl-drop does not: there an expired
    message is simply gone. (Azure removes expired messages when a receiver asks, and peek may
    still show them until then, so only receives are checked.)"""
    dead_lettering, dropping = "contract-ttl", "contract-ttl-drop"
    queues = (dead_lettering, dropping)
    for queue in queues:
        drain(queue)
        drain(queue, dead_letter=True)
    marker = str(uuid.uuid4())
    for queue in (dead_lettering, dropping):
        with client.get_queue_sender(queue) as sender:
            sender.send_messages(
                ServiceBusMessage(
                    "short-lived", message_id=marker, time_to_live=dt.timedelta(seconds=1)
                )
            )
            sender.send_messages(ServiceBusMessage("long-lived", message_id="long"))
    expired_at = time.monotonic() + 1.6
    with ExitStack() as stack:  # the links open while the message expires
        receivers = {q: stack.enter_context(client.get_queue_receiver(q)) for q in queues}
        dlqs = {
            q: stack.enter_context(
                client.get_queue_receiver(q, sub_queue=ServiceBusSubQueue.DEAD_LETTER)
            )
            for q in queues
        }
        time.sleep(max(0.0, expired_at - time.monotonic()))
        for queue, receiver in receivers.items():
            alive = _one(receiver)
            assert alive.message_id == "long", queue
            receiver.complete_message(alive)
            assert receiver.receive_messages(max_wait_time=0.5) == [], queue
        dead = _one(dlqs[dead_lettering])
        assert dead.message_id == marker
        assert dead.dead_letter_reason == "TTLExpiredException"
        assert dead.expires_at_utc is not None
        assert dead.expires_at_utc <= dt.datetime.now(dt.UTC)
        dlqs[dead_lettering].complete_message(dead)
        assert dlqs[dropping].receive_messages(max_wait_time=0.5) == []


@pytest.mark.timeout(30)
def test_subscription_dead_letter_queue(client: ServiceBusClient, drain) -> None:
    topic, sub = "contract-topic", "all"
    drain(topic=topic, subscription=sub)
    drain(topic=topic, subscription=sub, dead_letter=True)
    with client.get_topic_sender(topic) as sender:
        sender.send_messages(ServiceBusMessage("sub-poison", message_id=f"sp-{uuid.uuid4()}"))
    with client.get_subscription_receiver(topic, sub) as receiver:
        message = _one(receiver)
        receiver.dead_letter_message(message, reason="Nope", error_description="no handler")
    with client.get_subscription_receiver(
        topic, sub, sub_queue=ServiceBusSubQueue.DEAD_LETTER
    ) as dlq:
        dead = _one(dlq)
        assert str(dead) == "sub-poison"
        assert dead.dead_letter_reason == "Nope"
        assert dead.dead_letter_error_description == "no handler"
        dlq.complete_message(dead)
