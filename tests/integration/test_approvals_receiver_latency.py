"""The approvals receiver hands over a command as soon as it arrives, whatever the phase.

Issue 17: with prefetch 0 the SDK ran a keep-alive thread that every 5 s read the receiver's
connection for the whole socket timeout (1 s) under the transport's socket lock; a command
arriving then waited up to ~1 s more in the receive loop. The receiver the forwarder opens
(``open_receiver``) has no such thread. Against the real Service Bus emulator, with the real
SDK: commands sent at many phases over more than two keep-alive periods each reach the
receive loop within a generous behavioural bound (0.5 s; the fault cost ~1 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusMessage

from emulators.servicebus.testing import running_emulator
from sebridge import servicebus
from sebridge.forwarder.approvals.receiver import RECEIVE_WAIT, open_receiver

pytestmark = pytest.mark.slow  # every test here takes about 8 s or more

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
VM = "vm-latency"
BOUND_S = 0.5  # a command must reach the loop within this; the keep-alive stall was ~1 s
COMMANDS = 28
GAP_S = 0.45  # 28 x 0.45 s = 12.6 s: more than two 5 s keep-alive periods, many phases


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG) as process:
        yield process


@pytest.mark.timeout(120)
def test_commands_reach_the_receive_loop_at_once_at_any_phase(emulator: Any) -> None:
    received: dict[str, float] = {}
    stop = threading.Event()
    opened = threading.Event()
    errors: list[BaseException] = []
    keep_alive_threads: list[object] = []

    def receive_loop() -> None:
        try:
            with (
                servicebus.client(connection_string=emulator.connection_string) as client,
                open_receiver(client, "approvals", VM) as receiver,
            ):
                keep_alive_threads.append(receiver._handler._keep_alive_thread)
                opened.set()
                while not stop.is_set():  # the forwarder's loop: one at a time
                    for message in receiver.receive_messages(
                        max_message_count=1, max_wait_time=RECEIVE_WAIT
                    ):
                        received[str(message.message_id)] = time.monotonic()
                        receiver.complete_message(message)
        except BaseException as exc:  # reported by the test below
            errors.append(exc)
            opened.set()

    thread = threading.Thread(target=receive_loop, daemon=True)
    thread.start()
    sent: dict[str, float] = {}
    try:
        assert opened.wait(30), "the receiver did not open"
        assert not errors, errors
        # The mechanism itself: no SDK thread reads this connection beside the loop.
        assert keep_alive_threads == [None]
        with (
            servicebus.client(connection_string=emulator.connection_string) as client,
            client.get_queue_sender("approvals") as sender,
        ):
            for index in range(COMMANDS):
                message_id = f"latency-{index}"
                sender.send_messages(
                    ServiceBusMessage(b"{}", message_id=message_id, session_id=VM), timeout=10
                )
                sent[message_id] = time.monotonic()
                time.sleep(GAP_S)
        deadline = time.monotonic() + 30
        while len(received) < COMMANDS and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(timeout=RECEIVE_WAIT + 15)
    assert not errors, errors
    assert set(received) == set(sent)
    late = {
        message_id: round(received[message_id] - sent[message_id], 3)
        for message_id in sent
        if received[message_id] - sent[message_id] > BOUND_S
    }
    assert not late, f"commands that waited in the receiver longer than {BOUND_S} s: {late}"
