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
