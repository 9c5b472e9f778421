"""A time window that needs real seconds to pass: duplicate detection history running out.

Azure's shortest duplicate detection window is 20 s (contract-dedup-window). The original and an
immediate duplicate of it are sent as the test session starts (``dedup_window_probe`` in
conftest.py), and this module sorts last, so by the time it runs the window has mostly run out
while the other tests ran; the test waits only for what is left (all of it when run alone).
"""

from __future__ import annotations

import time

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode

QUEUE = "contract-dedup-window"
WINDOW = 20.0  # its DuplicateDetectionHistoryTimeWindow
MARGIN = 1.0


@pytest.mark.timeout(60)
def test_duplicate_after_the_window_is_accepted(
    client: ServiceBusClient, dedup_window_probe
) -> None:
    probe = dedup_window_probe
    time.sleep(max(0.0, probe.sent_at + WINDOW + MARGIN - time.monotonic()))
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage("after-window", message_id=probe.message_id))
    bodies: list[str] = []
    deadline = time.monotonic() + 10
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        while len(bodies) < 2 and time.monotonic() < deadline:
            bodies += [
                str(m) for m in receiver.receive_messages(max_message_count=2, max_wait_time=2)
            ]
        bodies += [str(m) for m in receiver.receive_messages(max_wait_time=0.5)]
    # the duplicate sent inside the window was dropped; the one sent after it was not
    assert sorted(bodies) == ["after-window", "original"]
