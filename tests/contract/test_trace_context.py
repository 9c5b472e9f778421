"""The trace context survives the wire: what the senders put in application properties is what
the forwarder's receiver reads back through the real SDK (keys arrive as bytes)."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from sebridge import servicebus
from sebridge.contract import tracecontext
from sebridge.contract.commands import approve_command

QUEUE = "contract-queue"


@pytest.mark.timeout(30)
def test_a_commands_traceparent_is_read_back_from_the_received_message(
    client: ServiceBusClient, drain
) -> None:
    drain(QUEUE)
    event_id = str(uuid.uuid4())
    expires = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
    command = approve_command(event_id, "approval-gate", "policy", expires)
    built = servicebus.command_message(command, "web-1")
    # The same properties on this queue, which has no sessions.
    sent = ServiceBusMessage(
        b"{}",
        message_id=f"trace-{uuid.uuid4()}",
        application_properties=built.application_properties,
    )
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(sent)
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        receiver.complete_message(got)
    read = tracecontext.from_properties(got.application_properties)
    assert read == command.trace_context()
    assert read is not None and read.trace_id == tracecontext.trace_id(event_id)
