"""The forwarder's Service Bus transport and endpoint settings, and the kernel's checks of them
(the SDK is loaded only to look at the client a setting builds; nothing connects)."""

from __future__ import annotations

import pytest
from azure.servicebus import TransportType

from sebridge import servicebus
from sebridge.forwarder.config import ConfigError, parse_config

CONNECTION = "Endpoint=sb://127.0.0.1:5672;SharedAccessKeyName=k;SharedAccessKey=x;"


def test_amqp_is_the_default_and_websocket_can_come_from_flag_or_environment() -> None:
    base = ["--connection-string", CONNECTION]
    assert parse_config(base, {}).servicebus_transport == "amqp"
    env = {"SEBRIDGE_SERVICEBUS_TRANSPORT": "websocket"}
    assert parse_config(base, env).servicebus_transport == "websocket"
    flag = [*base, "--servicebus-transport", "websocket"]
    config = parse_config(flag, {})
    assert config.servicebus_transport == "websocket"
    assert config.describe()["serviceBusTransport"] == "websocket"


def test_an_unknown_transport_from_the_environment_is_a_config_error() -> None:
    env = {"SEBRIDGE_SERVICEBUS_TRANSPORT": "amqp-ws"}
    with pytest.raises(ConfigError, match="amqp, websocket"):
        parse_config(["--connection-string", CONNECTION], env)


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://gw.example.net",
        "sb://",
        "sb://gw.example.net/path",
        "sb://user:pw@gw.example.net",
        "sb://gw.example.net:99999",
        "sb://gw.example.net:0",
        "gw.example.net:443",
    ],
)
def test_an_endpoint_that_is_not_sb_host_port_is_a_config_error(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="--servicebus-endpoint"):
        parse_config(["--connection-string", CONNECTION, "--servicebus-endpoint", endpoint], {})


def test_the_endpoint_and_transport_reach_the_client() -> None:
    with servicebus.client(
        connection_string=CONNECTION, transport="websocket", endpoint="sb://127.0.0.1:8443"
    ) as client:
        config = client._config  # the SDK's record of what it will dial
        assert config.transport_type == TransportType.AmqpOverWebsocket
        assert config.custom_endpoint_address.startswith("sb://127.0.0.1:8443")
    with servicebus.client(connection_string=CONNECTION) as client:
        assert client._config.transport_type == TransportType.Amqp
        assert client._config.custom_endpoint_address is None


def test_an_endpoint_with_the_default_transport_is_dialled_over_amqp() -> None:
    # The SDK picks WebSockets for a custom endpoint unless told otherwise: --servicebus-endpoint
    # sb://gateway:5671 with the default transport (amqp) must stay AMQP.
    with servicebus.client(
        connection_string=CONNECTION, transport="amqp", endpoint="sb://127.0.0.1:5671"
    ) as client:
        assert client._config.transport_type == TransportType.Amqp
        assert client._config.custom_endpoint_hostname == "127.0.0.1"
        assert client._config.connection_port == 5671


def test_the_kernel_refuses_an_unknown_transport() -> None:
    with pytest.raises(ValueError, match="transport"):
        servicebus.client(connection_string=CONNECTION, transport="http")
