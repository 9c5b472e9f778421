"""$management operations the SDK uses: peek, schedule and cancel, duplicate detection."""

from __future__ import annotations

import datetime as dt
import time
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

QUEUE = "contract-queue"


@pytest.mark.timeout(30)
def test_peek_shows_messages_without_locking_them(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(
            [ServiceBusMessage(f"peek-{i}", message_id=f"peek-{i}") for i in range(3)]
        )
    with client.get_queue_receiver(QUEUE) as receiver:
        peeked = receiver.peek_messages(max_message_count=10)
        assert [m.message_id for m in peeked] == ["peek-0", "peek-1", "peek-2"]
        assert all(m.lock_token is None for m in peeked)
        later = receiver.peek_messages(
            max_message_count=10, sequence_number=peeked[1].sequence_number
        )
        assert [m.message_id for m in later] == ["peek-1", "peek-2"]
        got = receiver.receive_messages(max_message_count=3, max_wait_time=5)
        while len(got) < 3:
            more = receiver.receive_messages(max_message_count=3 - len(got), max_wait_time=3)
            assert more, "messages went missing after peek"
            got += more
        assert [m.message_id for m in got] == ["peek-0", "peek-1", "peek-2"]
        assert all(m.delivery_count == 0 for m in got)
        for message in got:
            receiver.complete_message(message)


@pytest.mark.timeout(30)
def test_schedule_and_cancel(client: ServiceBusClient, drain) -> None:
    drain(QUEUE)
    with client.get_queue_receiver(QUEUE) as receiver, client.get_queue_sender(QUEUE) as sender:
        at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        (kept,) = sender.schedule_messages(ServiceBusMessage("scheduled", message_id="sched"), at)
        (dropped,) = sender.schedule_messages(ServiceBusMessage("cancelled"), at)
        assert kept != dropped
        sender.cancel_scheduled_messages(dropped)
        direct = ServiceBusMessage("via-property", message_id="direct")
        direct.scheduled_enqueue_time_utc = at
        sender.send_messages(direct)
        early = receiver.receive_messages(max_wait_time=0.5)
        assert dt.datetime.now(dt.UTC) < at, "too slow to check the early receive"
        assert early == []
        got: list = []
        deadline = time.monotonic() + 8
        while len(got) < 2 and time.monotonic() < deadline:
            got += receiver.receive_messages(max_message_count=2, max_wait_time=2)
        assert sorted(m.message_id for m in got) == ["direct", "sched"]
        for message in got:
            assert message.scheduled_enqueue_time_utc is not None
            assert abs((message.scheduled_enqueue_time_utc - at).total_seconds()) < 0.01
            assert message.enqueued_time_utc >= at - dt.timedelta(milliseconds=50)
            receiver.complete_message(message)
        assert receiver.receive_messages(max_wait_time=1) == []  # the cancelled one stays gone


@pytest.mark.timeout(30)
def test_queue_duplicate_detection(client: ServiceBusClient, drain) -> None:
    queue = "contract-dedup"
    drain(queue)
    message_id = f"dup-{uuid.uuid4()}"
    with client.get_queue_sender(queue) as sender:
        sender.send_messages(ServiceBusMessage("one", message_id=message_id))
        sender.send_messages(ServiceBusMessage("two", message_id=message_id))
        batch = sender.create_message_batch()
        batch.add_message(ServiceBusMessage("three", message_id=message_id))
        batch.add_message(ServiceBusMessage("other", message_id=f"{message_id}-other"))
        sender.send_messages(batch)
    with client.get_queue_receiver(queue) as receiver:
        got = receiver.receive_messages(max_message_count=10, max_wait_time=3)
        got += receiver.receive_messages(max_message_count=10, max_wait_time=1)
        assert sorted(str(m) for m in got) == ["one", "other"]
        for message in got:
            receiver.complete_message(message)
