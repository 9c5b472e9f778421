"""The emulator as a program: the server convention and refusing a bad config (local only)."""

from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusAuthenticationError

from emulators.servicebus.testing import EmulatorError, running_emulator

CONFIG = Path(__file__).with_name("Config.json")


@pytest.mark.timeout(60)
def test_listening_line_sigterm_and_restart_on_the_same_port() -> None:
    with running_emulator() as emulator:  # default config: infra/servicebus-emulator
        port = emulator.port
        assert port > 0
        for garbage in (b"GET / HTTP/1.1\r\n\r\n", b"AMQP\x03\x01\x00\x00" + b"\xff" * 64):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                raw.sendall(garbage)
                raw.settimeout(5)
                with suppress(OSError):
                    while raw.recv(4096):  # the emulator answers, then drops the connection
                        pass
        with ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0
        ) as client:
            with client.get_topic_sender("scheduled-events", keep_alive=0) as sender:
                sender.send_messages(ServiceBusMessage("x", session_id="e1", message_id="a"))
            with pytest.raises(ServiceBusAuthenticationError):
                with client.get_queue_sender("contract-queue", keep_alive=0) as sender:
                    sender.send_messages(ServiceBusMessage("not in this config"))
        emulator.restart()
        assert emulator.port == port
        assert emulator.returncode == 0  # SIGTERM stops it cleanly
    assert emulator.returncode == 0
    assert not emulator.running


@pytest.mark.timeout(60)
def test_a_stopped_emulator_keeps_its_ports_until_it_starts_again() -> None:
    """An outage (stop, then start on the same port) left the ports free for seconds: another
    process (a worker's bind, a reserve_port probe) could take one, and the restart failed or
    the clients reached someone else. While stopped, they are held: refused, not free."""
    with running_emulator(CONFIG, websocket=True) as emulator:
        ports = [emulator.port, emulator.websocket_port]
        emulator.stop()
        for port in ports:
            assert port
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
            for host in ("127.0.0.1", ""):
                with socket.socket() as other, pytest.raises(OSError) as taken:
                    other.bind((host, port))
                assert taken.value.errno == errno.EADDRINUSE
        emulator.start()
        assert [emulator.port, emulator.websocket_port] == ports
        with (
            ServiceBusClient.from_connection_string(
                emulator.connection_string, retry_total=0
            ) as client,
            client.get_queue_sender("contract-queue", keep_alive=0) as sender,
        ):
            sender.send_messages(ServiceBusMessage("after the outage"))


@pytest.mark.timeout(30)
def test_first_stdout_line_and_help() -> None:
    command = [
        sys.executable,
        "-m",
        "sebridge.cli",
        "servicebus-emulator",
        "--port",
        "0",
        "--config",
        str(CONFIG),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("listening on amqp://127.0.0.1:") and line.endswith("\n")
        assert int(line.strip().rsplit(":", 1)[1]) > 0
    finally:
        process.terminate()
        assert process.wait(10) == 0
    help_text = subprocess.run(
        [sys.executable, "-m", "sebridge.cli", "servicebus-emulator", "--help"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    assert "in memory" in help_text and "--config" in help_text


@pytest.mark.timeout(30)
def test_bad_config_is_refused_with_the_entity_named(tmp_path: Path) -> None:
    document = json.loads(CONFIG.read_text())
    queue = document["UserConfig"]["Namespaces"][0]["Queues"][0]
    queue["Properties"]["LockDuration"] = "one minute"
    bad = tmp_path / "Config.json"
    bad.write_text(json.dumps(document))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sebridge.cli",
            "servicebus-emulator",
            "--port",
            "0",
            "--config",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "contract-queue" in result.stderr and "LockDuration" in result.stderr
    with pytest.raises(EmulatorError), running_emulator(bad):
        pass
