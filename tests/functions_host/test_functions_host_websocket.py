"""The functions host over AMQP over WebSockets against the emulator's WebSocket listener.

The host's clients come from its client factory; here the factory is the kernel's own
``sebridge.servicebus.client`` with ``transport="websocket"`` and the listener as endpoint (the
host has no transport setting of its own: in Azure, host.json's
``extensions.serviceBus.transportType`` chooses it). The app settings' connection string names
a port nothing listens on, so a trigger that fires and an output that arrives can only have
gone over WebSockets.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterator
from typing import Any

import pytest
from apps import sb_app
from apps import sb_blueprint as recorded
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceivedMessage
from conftest import HERE

from emulators.functions_host.connection import Connection, ConnectionStringConnection
from emulators.functions_host.host import FunctionsHost
from emulators.functions_host.hostconfig import HostConfig, ServiceBusOptions
from sebridge import servicebus

testing = pytest.importorskip("emulators.servicebus.testing")

CONFIG = HERE / "emulator-config.json"
OPTIONS = ServiceBusOptions(
    max_concurrent_calls=1,
    max_concurrent_sessions=2,
    session_idle_timeout=dt.timedelta(seconds=1),
)


@pytest.fixture(scope="module")
def emulator() -> Iterator[Any]:
    with testing.running_emulator(CONFIG, websocket=True) as running:
        yield running


def _peek(emulator: Any, queue: str) -> list[ServiceBusReceivedMessage]:
    with (
        ServiceBusClient.from_connection_string(emulator.connection_string) as client,
        client.get_queue_receiver(queue) as receiver,
    ):
        return list(receiver.peek_messages(max_message_count=10))


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_trigger_and_output_binding_over_websockets(emulator: Any) -> None:
    endpoint = f"sb://127.0.0.1:{emulator.websocket_port}"
    made: list[str] = []

    def websocket_client(connection: Connection, *, retry_total: int = 2) -> ServiceBusClient:
        assert isinstance(connection, ConnectionStringConnection)
        made.append(connection.setting)
        return servicebus.client(
            connection_string=connection.connection_string,
            transport="websocket",
            endpoint=endpoint,
            retry_total=retry_total,
            retry_backoff_factor=0.5,
            retry_backoff_max=4,
        )

    refused = emulator.connection_string.replace(f"127.0.0.1:{emulator.port};", "127.0.0.1:1;")
    assert refused != emulator.connection_string
    settings = {"FhServiceBus": refused, "FhTopicName": "fh-events"}
    recorded.relayed.clear()
    host = FunctionsHost(
        sb_app,
        settings,
        host_config=HostConfig(service_bus=OPTIONS),
        functions=["relay"],
        client_factory=websocket_client,
    )
    with host:
        with (
            ServiceBusClient.from_connection_string(emulator.connection_string) as client,
            client.get_queue_sender("relay-in") as sender,
        ):
            sender.send_messages(ServiceBusMessage("over websockets", message_id="ws-1"))
        assert recorded.relayed.wait_for(1, timeout=40) == ["ws-1"]
        deadline = time.monotonic() + 20
        while not (out := _peek(emulator, "relay-out")) and time.monotonic() < deadline:
            time.sleep(0.2)
    assert [str(m) for m in out] == ["relayed:over websockets"]
    assert made and set(made) == {"FhServiceBus"}  # the trigger's client and the output's
    assert _peek(emulator, "relay-in") == []  # completed over the same connection
