"""Fixtures for the Service Bus contract suite.

The same tests run against three kinds of namespace, with identical assertions:

* nothing set (the default): a session-scoped fixture starts the local emulator
  (``sebridge servicebus-emulator``) as a subprocess on a free port with
  tests/contract/Config.json and stops it at the end;
* ``SEBRIDGE_CONTRACT_CONNECTION_STRING``: a real namespace or Microsoft's emulator, reached
  with that connection string;
* ``SEBRIDGE_CONTRACT_NAMESPACE`` (``<name>.servicebus.windows.net``): a real namespace reached
  with azure-identity's DefaultAzureCredential.

For the last two, the entities of tests/contract/Config.json must exist with the same
properties (Microsoft's emulator can load that file as is). The tests drain what they use before
they start, so a namespace shared with earlier runs is fine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusReceiveMode, ServiceBusSubQueue

CONFIG = Path(__file__).with_name("Config.json")


class _Client(ServiceBusClient):
    """ServiceBusClient whose senders run without the SDK's keep-alive thread.

    The thread sleeps in 1 s steps and close() joins it, so every sender close would cost up
    to a second of wall time; the contract tests use short-lived senders. (Receivers without
    prefetch always get the thread; the SDK forces it.)
    """

    def get_queue_sender(self, queue_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("keep_alive", 0)
        return super().get_queue_sender(queue_name, **kwargs)

    def get_topic_sender(self, topic_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("keep_alive", 0)
        return super().get_topic_sender(topic_name, **kwargs)


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


@pytest.fixture(scope="session")
def namespace() -> Iterator[Namespace]:
    connection_string = os.environ.get("SEBRIDGE_CONTRACT_CONNECTION_STRING")
    fqns = os.environ.get("SEBRIDGE_CONTRACT_NAMESPACE")
    if connection_string:
        yield Namespace("connection-string", connection_string, None)
        return
    if fqns:
        yield Namespace("identity", None, fqns)
        return
    from emulators.servicebus.testing import running_emulator

    with running_emulator(CONFIG) as emulator:
        yield Namespace("local", emulator.connection_string, None, emulator)


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
        removed = 0
        deadline = time.monotonic() + 10
        kwargs: dict[str, Any] = {
            "receive_mode": ServiceBusReceiveMode.RECEIVE_AND_DELETE,
            "max_wait_time": 0.3,
        }
        if dead_letter:
            kwargs["sub_queue"] = ServiceBusSubQueue.DEAD_LETTER
        targets: list[dict[str, Any]] = (
            [{}] if not session_ids else [{"session_id": sid} for sid in session_ids]
        )
        for extra in targets:
            if queue is not None:
                receiver = client.get_queue_receiver(queue, **kwargs, **extra)
            else:
                assert topic is not None and subscription is not None
                receiver = client.get_subscription_receiver(topic, subscription, **kwargs, **extra)
            with receiver:
                for _ in range(100):
                    batch = receiver.receive_messages(max_message_count=100, max_wait_time=0.3)
                    removed += len(batch)
                    if not batch or time.monotonic() > deadline:
                        break
        return removed

    return _drain
