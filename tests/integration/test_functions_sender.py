"""The Function App's Service Bus sender (functions/adapters/servicebus.py) against the emulator.

Many invocations of one process send at once (a burst of events, each publishing Prepared): the
sends of one entity are group-committed into batches. Attacked here over loopback with the real
SDK: forty threads at once (every message arrives once, in fewer sends than messages), a message
too large among small ones (only its own caller fails), and a broker restart between two sends.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError

from emulators.servicebus.testing import EmulatorProcess, running_emulator
from functions.adapters.servicebus import ServiceBusSender

pytestmark = pytest.mark.timeout(120)

QUEUE = "sender-burst"
CONFIG = {
    "UserConfig": {
        "Namespaces": [
            {
                "Name": "sbemulatorns",
                "Queues": [
                    {
                        "Name": QUEUE,
                        "Properties": {
                            "DuplicateDetectionHistoryTimeWindow": "PT10M",
                            "LockDuration": "PT30S",
                            "MaxDeliveryCount": 3,
                            "RequiresDuplicateDetection": True,
                            "RequiresSession": False,
                        },
                    }
                ],
                "Topics": [],
            }
        ],
        "Logging": {"Type": "Console"},
    }
}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    config = tmp_path_factory.mktemp("sender") / "Config.json"
    config.write_text(json.dumps(CONFIG))
    with running_emulator(Path(config)) as running:
        yield running


@pytest.fixture
def sender(emulator: EmulatorProcess) -> Iterator[ServiceBusSender]:
    sender = ServiceBusSender(namespace="", connection_string=emulator.connection_string)
    yield sender
    sender.close()


def received_ids(emulator: EmulatorProcess, expected: int) -> list[str]:
    """Every message on the queue (completed): until ``expected`` arrived, then one more
    short wait for any duplicate."""
    ids: list[str] = []
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver(QUEUE) as receiver,
    ):
        while True:
            wait = 5.0 if len(ids) < expected else 0.5
            batch = receiver.receive_messages(max_message_count=50, max_wait_time=wait)
            if not batch:
                return ids
            for message in batch:
                ids.append(str(message.message_id))
                receiver.complete_message(message)


def send_all(sender: ServiceBusSender, messages: list[ServiceBusMessage]) -> dict[str, str]:
    """Send each message from a thread of its own, all at once: message id -> 'ok' or error."""
    outcome: dict[str, str] = {}
    start = threading.Barrier(len(messages))

    def one(message: ServiceBusMessage) -> None:
        start.wait()
        try:
            sender.send_to_queue(QUEUE, message)
            outcome[str(message.message_id)] = "ok"
        except Exception as exc:  # recorded for the assertions
            outcome[str(message.message_id)] = type(exc).__name__

    threads = [threading.Thread(target=one, args=(m,)) for m in messages]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a send never returned"
    return outcome


def test_forty_concurrent_sends_arrive_once_in_fewer_sends(
    emulator: EmulatorProcess, sender: ServiceBusSender
) -> None:
    messages = [ServiceBusMessage(f"m{n}", message_id=f"burst-{n}") for n in range(40)]
    outcome = send_all(sender, messages)
    assert set(outcome.values()) == {"ok"}
    assert sorted(received_ids(emulator, 40)) == sorted(f"burst-{n}" for n in range(40))
    # The first send opens the link while the others queue up behind it.
    assert sender.batches.batches < 40 and sender.batches.largest > 1


def test_a_message_too_large_fails_only_its_own_send(
    emulator: EmulatorProcess, sender: ServiceBusSender
) -> None:
    small = [ServiceBusMessage(f"s{n}", message_id=f"small-{n}") for n in range(9)]
    large = ServiceBusMessage(b"x" * 300_000, message_id="large")  # over Standard's 256 KB
    outcome = send_all(sender, [*small[:5], large, *small[5:]])
    assert outcome.pop("large") == MessageSizeExceededError.__name__
    assert set(outcome.values()) == {"ok"}
    assert sorted(received_ids(emulator, 9)) == sorted(f"small-{n}" for n in range(9))


@pytest.mark.slow
def test_a_send_after_the_broker_restarted_goes_through(
    emulator: EmulatorProcess, sender: ServiceBusSender
) -> None:
    sender.send_to_queue(QUEUE, ServiceBusMessage("before", message_id="before"))
    emulator.restart()  # in-memory broker: comes back empty, the link is dead
    after = f"after-{uuid.uuid4()}"
    sender.send_to_queue(QUEUE, ServiceBusMessage("after", message_id=after))
    assert received_ids(emulator, 1) == [after]
