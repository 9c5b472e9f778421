"""`sebridge servicebus-emulator --help` says each option's default and how to connect over
TLS and WebSockets."""

from __future__ import annotations

from emulators.servicebus.server import _parser


def test_every_option_states_its_default() -> None:
    parser = _parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.help and "default" in action.help, action.option_strings
    text = " ".join(parser.format_help().split())
    assert "(default 5672)" in text and "(default 127.0.0.1" in text


def test_help_says_how_to_connect_over_tls_and_websockets() -> None:
    text = " ".join(_parser().format_help().split())
    for needle in (
        "AMQPWSB10",
        "TransportType.AmqpOverWebsocket",
        "custom_endpoint_address='sb://127.0.0.1:<websocket port>'",
        "connection_verify=<ca_cert>",
        "WITHOUT UseDevelopmentEmulator",
        "--servicebus-transport websocket",
    ):
        assert needle in text, needle
