"""The emulator keeps working with more than 1024 file descriptors open.

Each connection holds three descriptors in the emulator (the client's socket and a socket pair
to Proton). A functions host opens 64 receivers per session trigger, so two hosts reach ~1,500
descriptors; the per-connection pump waited with select(), which refuses descriptors from 1024
up, so connections above that ended at once (the two-hosts capacity test saw the broker refuse
connections). Attacked here cheaply: 1,100 idle TCP connections hold low descriptors in the
emulator, then a real SDK client sends and receives through a pump whose descriptors are all
above 1024.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from emulators.servicebus.testing import running_emulator

CONFIG = Path(__file__).with_name("Config.json")
QUEUE = "contract-queue"
IDLE_CONNECTIONS = 1100


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_client_beyond_1024_descriptors_is_served() -> None:
    with running_emulator(CONFIG) as emulator, contextlib.ExitStack() as idle:
        port = emulator.port
        for _ in range(IDLE_CONNECTIONS):
            sock = idle.enter_context(socket.create_connection(("127.0.0.1", port), timeout=5))
            del sock  # held open by the exit stack: the emulator waits for its handshake
        body = f"beyond-{uuid.uuid4()}"
        with ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as client:
            with client.get_queue_sender(QUEUE) as sender:
                sender.send_messages(ServiceBusMessage(body), timeout=20)
            with client.get_queue_receiver(QUEUE, max_wait_time=10) as receiver:
                got = receiver.receive_messages(max_message_count=1, max_wait_time=10)
                assert [str(m) for m in got] == [body]
                receiver.complete_message(got[0])


def test_select_by_poll_answers_as_select_does() -> None:
    """The replacement keeps select()'s contract on what it is given: a readable socket, a
    writable one, a hang-up counted as readable, a timeout with nothing ready."""
    from emulators.servicebus.polling import select_by_poll

    left, right = socket.socketpair()
    try:
        assert select_by_poll([left], [], [], 0.05) == ([], [], [])  # nothing to read yet
        assert select_by_poll([], [left], [], 0.05) == ([], [left], [])
        right.sendall(b"x")
        assert select_by_poll([left, right], [right], [], 1.0) == ([left], [right], [])
        right.close()
        left.recv(1)
        readable, _, _ = select_by_poll([left], [], [], 1.0)
        assert readable == [left]  # EOF: recv returns b"" at once, as after select()
        assert left.recv(1) == b""
        with pytest.raises(OSError):
            select_by_poll([right], [], [], 0)  # a closed socket
    finally:
        left.close()
