"""The real forwarder over AMQP over WebSockets (``--servicebus-transport websocket``), as a
forwarder behind a proxy or with only port 443 open runs, against the emulator's WebSocket
listener: it publishes on the topic and takes an approve command from its session of the
approvals queue, both through the SDK's websocket transport.

The connection string names a port nothing listens on, so only the WebSocket endpoint
(``--servicebus-endpoint``) can carry the traffic: a pass cannot come from plain AMQP.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient

from emulators.imds.testing import running_simulator
from emulators.processes import forwarder
from emulators.servicebus.testing import running_emulator
from sebridge import servicebus
from sebridge.contract.commands import approve_command
from sebridge.contract.events import parse_message
from tests.support.bus import receive_all
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "infra" / "servicebus-emulator" / "Config.json"
VM = "vm-ws"


@pytest.fixture
def emulator() -> Iterator[Any]:
    with running_emulator(CONFIG, websocket=True) as process:
        yield process


def _nowhere(connection_string: str, port: int) -> str:
    """The same connection string with its endpoint on a port that refuses connections."""
    refused = connection_string.replace(f"127.0.0.1:{port};", "127.0.0.1:1;")
    assert refused != connection_string
    return refused


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_the_forwarder_publishes_and_takes_approvals_over_websockets(
    emulator: Any, tmp_path: Path
) -> None:
    connection = _nowhere(emulator.connection_string, emulator.port)
    with (
        running_simulator("user-reboot", speed=0.05, extra_args=["--start-on-first-poll"]) as sim,
        forwarder(
            sim.base_url,
            tmp_path,
            "--connection-string",
            connection,
            "--vm-name",
            VM,
            "--servicebus-transport",
            "websocket",
            "--servicebus-endpoint",
            f"sb://127.0.0.1:{emulator.websocket_port}",
            dry_run=False,
        ) as fw,
    ):
        (scheduled,) = receive_all(emulator.connection_string, "lb-pools", want=1, timeout=60)
        assert scheduled["subject"] == "Scheduled", fw.stderr_text()[-3000:]
        event_id = parse_message(scheduled["body"]).event_id
        expires = datetime.now(UTC) + timedelta(minutes=10)
        command = approve_command(event_id, "ops", "over websockets", expires)
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_queue_sender("approvals") as sender,
        ):
            sender.send_messages(servicebus.command_message(command, VM))

        def approved() -> bool:
            return any(
                event_id.lower() in str(post).lower() and "StartRequests" in str(post)
                for post in sim.posts()
            )

        wait_until(approved, 60, "the approve command's POST to IMDS")
        log = fw.stderr_text()
        assert fw.alive, log[-3000:]
    assert '"serviceBusTransport": "websocket"' in log, log[:3000]


@pytest.mark.timeout(120)
def test_sebridge_approve_sends_over_websockets_and_says_clearly_when_it_cannot(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sebridge approve`` with the forwarder's transport flags: over WebSockets (the plain
    AMQP port in its connection string refuses) the command reaches the VM's session; with
    nothing to reach it exits 1 with one line saying so, and no traceback."""
    from sebridge.forwarder.approvals import cli as approve_cli

    event_id = "0d8e1a5f-0000-4000-8000-00000000ab01"
    connection = _nowhere(emulator.connection_string, emulator.port)
    code = approve_cli.main(
        [
            "--vm",
            VM,
            "--event-id",
            event_id,
            "--by",
            "ops",
            "--connection-string",
            connection,
            "--servicebus-transport",
            "websocket",
            "--servicebus-endpoint",
            f"sb://127.0.0.1:{emulator.websocket_port}",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver("approvals", session_id=VM, max_wait_time=5) as receiver,
    ):
        (received,) = receiver.receive_messages(max_message_count=5, max_wait_time=5)
        receiver.complete_message(received)
    assert received.message_id in out
    assert event_id in servicebus.message_body(received).decode()

    code = approve_cli.main(["--vm", VM, "--event-id", event_id, "--connection-string", connection])
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("sebridge approve: not sent (") and "Traceback" not in err
    assert "SharedAccessKey" not in err and "sent " not in out

    code = approve_cli.main(
        [
            "--vm",
            VM,
            "--event-id",
            event_id,
            "--connection-string",
            connection,
            "--servicebus-endpoint",
            "http://127.0.0.1:1",
        ]
    )
    assert code == 2 and "sb://HOST" in capsys.readouterr().err
