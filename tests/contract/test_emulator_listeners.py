"""The local emulator itself: AMQP over WebSockets (ws/wss), TLS, what a misbehaving or
departing client leaves in the log, the message size flag and tier. Local only: these start
their own emulators."""

from __future__ import annotations

import base64
import datetime as dt
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.servicebus import AutoLockRenewer, ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import MessageSizeExceededError

from emulators.servicebus.testing import EmulatorProcess, running_emulator

CONFIG = Path(__file__).with_name("Config.json")
QUEUE = "contract-queue"

pytestmark = pytest.mark.usefixtures("local_only")


@pytest.fixture(scope="module")
def emulator(
    local_only: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[EmulatorProcess]:
    log = tmp_path_factory.mktemp("emulator") / "emulator.log"
    with running_emulator(CONFIG, tls=True, websocket=True, log_path=log) as process:
        yield process


def _round_trip(client: ServiceBusClient, body: str) -> None:
    with client.get_queue_sender(QUEUE, keep_alive=0) as sender:
        sender.send_messages(ServiceBusMessage(body))
    with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
        got = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert [str(m) for m in got] == [body]
        receiver.complete_message(got[0])


def _log(emulator: EmulatorProcess) -> str:
    assert emulator.log_path is not None
    return emulator.log_path.read_text()


@pytest.mark.timeout(60)
def test_wss_round_trip_through_the_sdk(emulator: EmulatorProcess) -> None:
    """wss:// (ws:// is covered against the suite's emulator by test_parity): a connection
    string without UseDevelopmentEmulator (which turns TLS off) plus the client keywords."""
    assert emulator.websocket_tls_port and emulator.ca_cert
    with ServiceBusClient.from_connection_string(
        emulator.tls_connection_string, retry_total=0, **emulator.websocket_kwargs(tls=True)
    ) as client:
        _round_trip(client, "over wss")


def _upgrade(port: int, path: str, protocol: str | None) -> bytes:
    key = base64.b64encode(b"0123456789abcdef").decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = raw.recv(4096)
            if not chunk:
                break
            answer += chunk
        return answer


@pytest.mark.timeout(60)
def test_websocket_upgrades_that_are_not_amqp_are_refused(emulator: EmulatorProcess) -> None:
    port = emulator.websocket_port
    assert port is not None
    assert _upgrade(port, "/$servicebus/websocket", "AMQPWSB10").startswith(b"HTTP/1.1 101 ")
    assert _upgrade(port, "/elsewhere", "AMQPWSB10").startswith(b"HTTP/1.1 404 ")
    assert _upgrade(port, "/$servicebus/websocket", None).startswith(b"HTTP/1.1 400 ")
    assert _upgrade(port, "/$servicebus/websocket", "mqtt").startswith(b"HTTP/1.1 400 ")
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01 not http at all\r\n\r\n")
        assert raw.recv(4096).startswith(b"HTTP/1.1 400 ")
    # a TLS listener given plain bytes drops them; the emulator keeps serving everyone
    with socket.create_connection(("127.0.0.1", emulator.websocket_tls_port or 0)) as raw:
        raw.settimeout(5)
        raw.sendall(b"GET / HTTP/1.1\r\n\r\n")
        try:
            while raw.recv(4096):
                pass
        except OSError:
            pass
    with ServiceBusClient.from_connection_string(
        emulator.connection_string, retry_total=0, **emulator.websocket_kwargs()
    ) as client:
        _round_trip(client, "still serving")
    log = _log(emulator)
    assert "WebSocket upgrade refused (404" in log and "WebSocket upgrade refused (400" in log


@pytest.mark.timeout(90)
def test_clients_coming_and_going_leave_no_errors_in_the_log(emulator: EmulatorProcess) -> None:
    """Closing clients (several links, prefetch, a lock renewer with several workers, a
    websocket one) must not leave ERROR lines or tracebacks: a departing client is not an
    emulator error. Lock renewals from several threads used to close the connection with
    'sequencing error'."""
    before = len(_log(emulator))
    for transport in (emulator.websocket_kwargs(),):  # plain AMQP: test_parity's concurrency test
        with ServiceBusClient.from_connection_string(
            emulator.connection_string, retry_total=0, **transport
        ) as client:
            with client.get_queue_sender(QUEUE) as sender:
                sender.send_messages([ServiceBusMessage(f"m-{i}") for i in range(8)])
            renewer = AutoLockRenewer(max_lock_renewal_duration=10, max_workers=6)
            with client.get_queue_receiver(
                QUEUE, max_wait_time=2, prefetch_count=4, auto_lock_renewer=renewer
            ) as receiver:
                got: list = []
                deadline = time.monotonic() + 10
                while len(got) < 8 and time.monotonic() < deadline:
                    got += receiver.receive_messages(max_message_count=4, max_wait_time=1)
                time.sleep(1.0)  # the renewer's workers renew concurrently (5 s locks)
                for message in got:
                    receiver.complete_message(message)
            renewer.close()
            assert len(got) == 8
    time.sleep(0.5)  # let the emulator notice the closed sockets
    new_lines = _log(emulator)[before:]
    assert " ERROR " not in new_lines and "Traceback" not in new_lines, new_lines[-3000:]
    assert "sequencing error" not in new_lines


@pytest.mark.timeout(30)
def test_tls_and_websocket_ports_need_a_trusted_certificate(emulator: EmulatorProcess) -> None:
    context = ssl.create_default_context()  # the system's CAs only: the handshake must fail
    with socket.create_connection(("127.0.0.1", emulator.websocket_tls_port or 0)) as raw:
        with pytest.raises(ssl.SSLError):
            context.wrap_socket(raw, server_hostname="localhost").do_handshake()
    trusting = ssl.create_default_context(cafile=emulator.ca_cert)
    with socket.create_connection(("127.0.0.1", emulator.tls_port or 0)) as raw:
        with trusting.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"AMQP\x03\x01\x00\x00")
            assert tls.recv(8) == b"AMQP\x03\x01\x00\x00"


@pytest.mark.timeout(60)
def test_max_message_size_flag_lowers_what_is_advertised_and_enforced(local_only: None) -> None:
    with running_emulator(CONFIG, extra_args=["--max-message-size", "2048"]) as small:
        with ServiceBusClient.from_connection_string(small.connection_string, retry_total=0) as c:
            with c.get_queue_sender(QUEUE, keep_alive=0) as sender:
                batch = sender.create_message_batch()
                assert batch.max_size_in_bytes == 2048
                with pytest.raises(MessageSizeExceededError):
                    sender.send_messages(ServiceBusMessage(b"x" * 2100))
                with pytest.raises(MessageSizeExceededError):
                    sender.schedule_messages(
                        ServiceBusMessage(b"x" * 2100), dt.datetime.now(dt.UTC)
                    )
                with pytest.raises(ValueError, match="too large"):
                    sender.create_message_batch(max_size_in_bytes=4096)
                while True:
                    try:
                        batch.add_message(ServiceBusMessage(b"b" * 200))
                    except MessageSizeExceededError:
                        break
                sender.send_messages(batch)
                sender.send_messages(ServiceBusMessage(b"x" * 1800))


@pytest.mark.timeout(60)
def test_premium_tier_takes_the_entity_limit_and_a_1_mb_batch(
    local_only: None, tmp_path: Path
) -> None:
    document = json.loads(CONFIG.read_text())
    namespace = document["UserConfig"]["Namespaces"][0]
    namespace["Tier"] = "Premium"
    namespace["Queues"][0]["Properties"]["MaxMessageSizeInKilobytes"] = 2048
    config = tmp_path / "Config.json"
    config.write_text(json.dumps(document))
    with running_emulator(config) as premium:
        with ServiceBusClient.from_connection_string(
            premium.connection_string, retry_total=0
        ) as client:
            with client.get_queue_sender(QUEUE, keep_alive=0) as sender:
                assert sender.create_message_batch().max_size_in_bytes == 1024 * 1024
                sender.send_messages(ServiceBusMessage(b"p" * (1536 * 1024)))
                with pytest.raises(MessageSizeExceededError):
                    sender.send_messages(ServiceBusMessage(b"p" * (2049 * 1024)))
            with client.get_queue_receiver(QUEUE, max_wait_time=5) as receiver:
                (got,) = receiver.receive_messages(max_message_count=1, max_wait_time=5)
                assert len(b"".join(got.body)) == 1536 * 1024
                receiver.complete_message(got)
