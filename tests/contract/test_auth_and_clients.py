"""Authentication ($cbs put-token with SAS and JWT) and several clients at once."""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus, urlencode

import pytest
from azure.core.credentials import AccessToken, AzureSasCredential
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusReceiveMode
from azure.servicebus.exceptions import ServiceBusAuthenticationError, ServiceBusError

QUEUE = "contract-queue"


def _settings(connection_string: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in connection_string.strip().rstrip(";").split(";") if p]
    return {k: v for k, v in pairs}


def _sas_token(resource: str, key_name: str, key: str, ttl: int = 600) -> str:
    expiry = int(time.time()) + ttl
    signed = f"{quote_plus(resource)}\n{expiry}".encode()
    signature = base64.b64encode(hmac.new(key.encode(), signed, hashlib.sha256).digest())
    return "SharedAccessSignature " + urlencode(
        {"sr": resource, "sig": signature, "se": str(expiry), "skn": key_name}
    )


class _FakeJwtCredential:
    """A TokenCredential handing out an unsigned JWT-shaped token (the emulator has no Entra ID)."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        header = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').decode().rstrip("=")
        body = base64.urlsafe_b64encode(b'{"aud":"https://servicebus.azure.net"}').decode()
        return AccessToken(f"{header}.{body.rstrip('=')}.sig", int(time.time()) + 3600)


def _round_trip(client: ServiceBusClient) -> None:
    marker = str(uuid.uuid4())
    with client.get_queue_sender(QUEUE) as sender:
        sender.send_messages(ServiceBusMessage(marker, message_id=marker))
    with client.get_queue_receiver(
        QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
    ) as receiver:
        got = receiver.receive_messages(max_message_count=1, max_wait_time=5)
        assert [m.message_id for m in got] == [marker]


@pytest.mark.timeout(30)
def test_wrong_sas_key_is_refused(namespace) -> None:
    if namespace.connection_string is None:
        pytest.skip("needs a connection string with a key")
    settings = _settings(namespace.connection_string)
    if "SharedAccessKey" not in settings:
        pytest.skip("connection string has no SharedAccessKey")
    settings["SharedAccessKey"] = "not-the-key"
    wrong = ";".join(f"{k}={v}" for k, v in settings.items()) + ";"
    with ServiceBusClient.from_connection_string(wrong, retry_total=0) as client:
        started = time.monotonic()
        with pytest.raises(ServiceBusAuthenticationError):
            with client.get_queue_sender(QUEUE) as sender:
                sender.send_messages(ServiceBusMessage("nope"))
        assert time.monotonic() - started < 10


@pytest.mark.timeout(30)
def test_sas_token_credential(namespace, drain) -> None:
    if namespace.connection_string is None:
        pytest.skip("needs a connection string with a key")
    settings = _settings(namespace.connection_string)
    if "SharedAccessKey" not in settings:
        pytest.skip("connection string has no SharedAccessKey")
    drain(QUEUE)
    host = settings["Endpoint"].split("://", 1)[1].rstrip("/")
    token = _sas_token(f"sb://{host}", settings["SharedAccessKeyName"], settings["SharedAccessKey"])
    emulator = settings.get("UseDevelopmentEmulator") == "true"
    with ServiceBusClient(
        host, AzureSasCredential(token), use_tls=not emulator, retry_total=0
    ) as client:
        _round_trip(client)
    bad = token.replace("sig=", "sig=AAAA")
    with ServiceBusClient(host, AzureSasCredential(bad), use_tls=not emulator, retry_total=0) as c:
        with pytest.raises(ServiceBusAuthenticationError):
            with c.get_queue_sender(QUEUE) as sender:
                sender.send_messages(ServiceBusMessage("nope"))


@pytest.mark.timeout(30)
def test_token_credential_with_host_and_port(namespace, drain) -> None:
    """``ServiceBusClient("127.0.0.1:<port>", credential, use_tls=False)``: the SDK keeps the
    port only without TLS (what UseDevelopmentEmulator=true sets)."""
    drain(QUEUE)
    if namespace.kind == "local":
        credential = _FakeJwtCredential()
        with ServiceBusClient(
            namespace.emulator.namespace, credential, use_tls=False, retry_total=0
        ) as client:
            _round_trip(client)
        assert ("https://servicebus.azure.net//.default",) in credential.scopes
    elif namespace.kind == "identity":
        with namespace.client() as client:
            _round_trip(client)
    else:
        pytest.skip("a token credential needs SEBRIDGE_CONTRACT_NAMESPACE")


@pytest.mark.timeout(60)
def test_several_clients_at_once(namespace, drain) -> None:
    drain(QUEUE)
    per_sender, senders = 40, 3
    run = uuid.uuid4().hex[:8]
    received: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def send(index: int) -> None:
        try:
            with namespace.client() as client, client.get_queue_sender(QUEUE) as sender:
                for i in range(0, per_sender, 10):
                    sender.send_messages(
                        [ServiceBusMessage(f"{run}-{index}-{j}") for j in range(i, i + 10)]
                    )
        except BaseException as exc:
            errors.append(exc)

    def receive() -> None:
        try:
            with namespace.client() as client, client.get_queue_receiver(QUEUE) as receiver:
                deadline = time.monotonic() + 30
                while len(received) < per_sender * senders and time.monotonic() < deadline:
                    for message in receiver.receive_messages(max_message_count=50, max_wait_time=1):
                        received.append(str(message))
                        receiver.complete_message(message)
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    threads = [threading.Thread(target=receive) for _ in range(2)]
    threads += [threading.Thread(target=send, args=(i,)) for i in range(senders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(45)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert errors == [], errors
    expected = sorted(f"{run}-{i}-{j}" for i in range(senders) for j in range(per_sender))
    assert sorted(received) == expected  # every message exactly once across two receivers


@pytest.mark.timeout(30)
def test_sending_to_a_subscription_is_refused(client: ServiceBusClient) -> None:
    with pytest.raises(ServiceBusError):
        with client.get_queue_sender("contract-topic/Subscriptions/all") as sender:
            sender.send_messages(ServiceBusMessage("x"))


@pytest.mark.timeout(30)
def test_sasl_plain_with_the_sas_key(namespace) -> None:
    """SASL PLAIN (key name / key) authorizes the connection without $cbs. The SDK itself always
    uses ANONYMOUS + $cbs, so this drives its AMQP layer directly; local emulator only."""
    if namespace.kind != "local":
        pytest.skip("drives the SDK's internal AMQP client against the local emulator")
    from azure.servicebus._pyamqp import SendClient
    from azure.servicebus._pyamqp.authentication import SASLPlainAuth
    from azure.servicebus._pyamqp.message import Header, Message

    from emulators.servicebus.testing import SAS_KEY, SAS_KEY_NAME

    emulator = namespace.emulator
    target = f"amqp://{emulator.namespace}/{QUEUE}"

    def send(password: str, user: str = SAS_KEY_NAME) -> None:
        client = SendClient(
            emulator.namespace,
            target,
            auth=SASLPlainAuth(authcid=user, passwd=password),
            use_tls=False,
        )
        try:
            client.open()
            deadline = time.monotonic() + 10
            while not client.client_ready():
                assert time.monotonic() < deadline, "link did not open"
                time.sleep(0.02)
            client.send_message(Message(data=[b"plain"], header=Header(durable=True)))
        finally:
            client.close()

    send(SAS_KEY)
    with pytest.raises(ValueError, match="SASL negotiation failed"):
        send("wrong")
    # a non-ASCII user name is refused like any wrong one, at once (it used to kill the
    # handshake thread, leaving the client to wait for its timeout)
    started = time.monotonic()
    with pytest.raises(ValueError, match="SASL negotiation failed"):
        send(SAS_KEY, user="Schlüssel-ключ")
    assert time.monotonic() - started < 5
    with (
        namespace.client() as client,
        client.get_queue_receiver(
            QUEUE, receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE
        ) as receiver,
    ):
        got = receiver.receive_messages(max_message_count=2, max_wait_time=3)
        assert [str(m) for m in got] == ["plain"]


@pytest.mark.timeout(40)
def test_tls_listener_with_self_signed_certificate() -> None:
    """The SDK's default (TLS) path: custom_endpoint_address + connection_verify. Local only:
    it starts its own emulator with ``--tls-port``."""
    from azure.servicebus import TransportType

    from emulators.servicebus.testing import running_emulator

    with running_emulator(Path(__file__).with_name("Config.json"), tls=True) as emulator:
        assert emulator.tls_port and emulator.ca_cert
        with ServiceBusClient(
            "localhost",
            _FakeJwtCredential(),
            custom_endpoint_address=f"sb://127.0.0.1:{emulator.tls_port}",
            transport_type=TransportType.Amqp,
            connection_verify=emulator.ca_cert,
            retry_total=0,
        ) as client:
            _round_trip(client)
        # the certificate is what makes it work: without it the handshake must fail
        with ServiceBusClient(
            "localhost",
            _FakeJwtCredential(),
            custom_endpoint_address=f"sb://127.0.0.1:{emulator.tls_port}",
            transport_type=TransportType.Amqp,
            retry_total=0,
        ) as client:
            with pytest.raises(ServiceBusError):
                with client.get_queue_sender(QUEUE) as sender:
                    sender.send_messages(ServiceBusMessage("x"))
