"""Fixtures for the Service Bus contract suite.

The same tests run against three kinds of namespace, with identical assertions:

* nothing set (the default): a session-scoped fixture starts the local emulator
  (``sebridge servicebus-emulator``) as a subprocess on a free port with
  tests/contract/Config.json and stops it at the end;
* ``SEBRIDGE_CONTRACT_CONNECTION_STRING``: a real namespace or Microsoft's emulator, reached
  with that connection string;
* ``SEBRIDGE_CONTRACT_NAMESPACE`` (``<name>.servicebus.windows.net``): a real namespace reached
  with azure-identity's DefaultAzureCredential.

For the last two, the session creates the entities of tests/contract/Config.json that are missing
(ServiceBusAdministrationClient, see provisioning.py; it needs Manage rights) and stops with a
clear message when existing ones differ; ``SEBRIDGE_CONTRACT_PROVISION=0`` skips that for
entities made beforehand. A connection string with ``UseDevelopmentEmulator=true`` (Microsoft's
emulator, which loads the file itself) is never provisioned. The tests drain what they use before
they start, and the session entities used with next-available session receivers are purged when
the session starts, so a namespace shared with earlier runs is fine.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from emulators.functions_host.sbclient import without_keep_alive_thread
from tests.contract.cleanup import drain_entity, purge_sessions
from tests.contract.provisioning import ProvisioningError, admin_calls, provision
from tests.contract.remote import on_a_remote_namespace

CONFIG = Path(__file__).with_name("Config.json")
# Session entities the tests read with next-available session receivers: whatever an earlier
# run left in any session there would be handed out instead of the test's own session.
NEXT_AVAILABLE_SESSION_QUEUES = ("contract-sessions",)
SESSION_LOCK_DURATION = 5.0  # their LockDuration
DEDUP_WINDOW_QUEUE = "contract-dedup-window"


class _Client(ServiceBusClient):
    """ServiceBusClient whose senders and receivers run without the SDK's keep-alive thread.

    The thread sleeps in 1 s steps and close() joins it, so every close would cost up to a
    second of wall time (most of this suite's time, before); the contract tests use
    short-lived senders and receivers.
    """

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("keep_alive", 0)
        return super().get_queue_sender(queue_name, **kwargs)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("keep_alive", 0)
        return super().get_topic_sender(topic_name, **kwargs)

    def get_queue_receiver(self, queue_name: str, **kwargs: Any) -> Any:
        return without_keep_alive_thread(super().get_queue_receiver(queue_name, **kwargs))

    def get_subscription_receiver(
        self, topic_name: str, subscription_name: str, **kwargs: Any
    ) -> Any:
        receiver = super().get_subscription_receiver(topic_name, subscription_name, **kwargs)
        return without_keep_alive_thread(receiver)


@dataclass
class Namespace:
    """How the tests reach the namespace under test."""

    kind: str  # local | connection-string | identity
    connection_string: str | None
    fully_qualified_namespace: str | None
    emulator: Any = None

    def client(self, **kwargs: Any) -> ServiceBusClient:
        kwargs.setdefault("retry_total", 1)
        kwargs.setdefault("retry_backoff_factor", 0.2)
        if self.connection_string is not None:
            return _Client.from_connection_string(self.connection_string, **kwargs)
        from azure.identity import DefaultAzureCredential

        assert self.fully_qualified_namespace is not None
        return _Client(self.fully_qualified_namespace, DefaultAzureCredential(), **kwargs)

    def websocket_client(self, **kwargs: Any) -> ServiceBusClient:
        """A client speaking AMQP over WebSockets: port 443 of a real namespace, the local
        emulator's --websocket-port (which the SDK only reaches through a custom endpoint)."""
        from azure.servicebus import TransportType

        if self.kind == "local":
            kwargs.update(self.emulator.websocket_kwargs())
        else:
            kwargs["transport_type"] = TransportType.AmqpOverWebsocket
        return self.client(**kwargs)

    @property
    def loads_config_itself(self) -> bool:
        """The local emulator and Microsoft's take their entities from Config.json."""
        if self.kind == "local":
            return True
        settings = (self.connection_string or "").replace(" ", "").lower().split(";")
        return "usedevelopmentemulator=true" in settings


def _provision(namespace: Namespace, request: pytest.FixtureRequest) -> None:
    """Create the missing entities of Config.json in a real namespace (see provisioning.py)."""
    if namespace.loads_config_itself or os.environ.get("SEBRIDGE_CONTRACT_PROVISION") == "0":
        return
    from azure.servicebus.management import ServiceBusAdministrationClient

    if namespace.connection_string is not None:
        admin = ServiceBusAdministrationClient.from_connection_string(namespace.connection_string)
    else:
        from azure.identity import DefaultAzureCredential

        assert namespace.fully_qualified_namespace is not None
        admin = ServiceBusAdministrationClient(
            namespace.fully_qualified_namespace, DefaultAzureCredential()
        )
    where = admin.fully_qualified_namespace
    try:
        with admin:
            created = provision(admin, admin_calls(json.loads(CONFIG.read_text())), where)
    except ProvisioningError as exc:
        pytest.exit(f"contract suite: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    if created:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"contract suite: created in {where}: {', '.join(created)}")


@pytest.fixture(scope="session")
def namespace(request: pytest.FixtureRequest) -> Iterator[Namespace]:
    connection_string = os.environ.get("SEBRIDGE_CONTRACT_CONNECTION_STRING")
    fqns = os.environ.get("SEBRIDGE_CONTRACT_NAMESPACE")
    if connection_string or fqns:
        remote = (
            Namespace("connection-string", connection_string, None)
            if connection_string
            else Namespace("identity", None, fqns)
        )
        _provision(remote, request)
        yield remote
        return
    from emulators.servicebus.testing import running_emulator

    with running_emulator(CONFIG, websocket=True) as emulator:
        yield Namespace("local", emulator.connection_string, None, emulator)


@pytest.fixture(scope="session")
def local_only() -> None:
    """Skip a test of the local emulator itself (its listeners, flags, log) when the suite runs
    against another namespace: there it would only test the emulator, not the namespace."""
    if on_a_remote_namespace():
        pytest.skip("tests the local emulator itself; the suite runs against another namespace")


@pytest.fixture
def client(namespace: Namespace) -> Iterator[ServiceBusClient]:
    with namespace.client() as sb_client:
        yield sb_client


Drain = Callable[..., int]


_DRAINED: set[tuple[object, ...]] = set()


@pytest.fixture
def drain(client: ServiceBusClient, namespace: Namespace) -> Drain:
    """Remove every message of an entity (receive-and-delete), bounded in count and time.

    Each entity is drained once per test session (a shared namespace may hold leftovers of
    earlier runs); after that every test settles what it receives, so draining again would
    only cost time (opening a receiver takes the SDK about half a second). The local emulator
    starts empty for each test session, so there is nothing to drain there.
    """

    def _drain(
        queue: str | None = None,
        *,
        topic: str | None = None,
        subscription: str | None = None,
        dead_letter: bool = False,
        session_ids: tuple[str, ...] = (),
    ) -> int:
        key = (queue, topic, subscription, dead_letter, session_ids)
        if namespace.kind == "local" or key in _DRAINED:
            return 0
        _DRAINED.add(key)
        return drain_entity(
            client,
            queue,
            topic=topic,
            subscription=subscription,
            dead_letter=dead_letter,
            session_ids=session_ids,
        )

    return _drain


@pytest.fixture(scope="session")
def sessions_purged(namespace: Namespace) -> None:
    """Purge the next-available session entities once, before the first test that uses them.

    Bounded: a minute at most; each entity costs at least one ``accept_wait`` (the SDK's
    next-available timeout that says no session is left). Nothing to do locally.
    """
    if namespace.kind == "local":
        return
    with namespace.client(retry_total=0) as sb_client:
        for queue in NEXT_AVAILABLE_SESSION_QUEUES:
            purge_sessions(sb_client, queue, accept_wait=SESSION_LOCK_DURATION + 1)


@dataclass(frozen=True)
class WindowProbe:
    """A message sent to the duplicate detection window queue when the session started."""

    message_id: str
    sent_at: float  # time.monotonic() once the broker had accepted it


@pytest.fixture(scope="session")
def dedup_window_probe(namespace: Namespace) -> WindowProbe:
    """Send ``original`` and, at once, a duplicate of it (dropped) to contract-dedup-window."""
    with namespace.client() as sb_client:
        if namespace.kind != "local":
            drain_entity(sb_client, DEDUP_WINDOW_QUEUE)
        message_id = f"window-{uuid.uuid4()}"
        with sb_client.get_queue_sender(DEDUP_WINDOW_QUEUE) as sender:
            sender.send_messages(ServiceBusMessage("original", message_id=message_id))
            sent_at = time.monotonic()
            sender.send_messages(ServiceBusMessage("inside-window", message_id=message_id))
    return WindowProbe(message_id, sent_at)


@pytest.fixture(scope="session", autouse=True)
def _start_window_clocks(request: pytest.FixtureRequest) -> None:
    """Send the window probe as the session starts when a selected test needs it, so Azure's
    shortest duplicate detection window (20 s) runs out while the rest of the suite runs."""
    if any("dedup_window_probe" in getattr(i, "fixturenames", ()) for i in request.session.items):
        request.getfixturevalue("dedup_window_probe")
