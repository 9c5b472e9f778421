"""The functions host's Service Bus clients (built by ``sebridge.servicebus.client``, from
the connection settings as the runtime reads them) and output sending.

Clients are not thread-safe, so every receiver thread owns its client, and each output entity
has one sender guarded by a lock. The SDK's own retries are kept short; longer outages are
handled by the callers' reconnect loop with ``sebridge.retry.Backoff``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from azure.functions.servicebus import ServiceBusMessageOutConverter
from azure.servicebus import ServiceBusClient, ServiceBusMessage, ServiceBusSender

from emulators.functions_host.bindings import ServiceBusOutput
from emulators.functions_host.connection import (
    Connection,
    ConnectionStringConnection,
    IdentityConnection,
)
from sebridge import servicebus

_R = TypeVar("_R")
ClientFactory = Callable[..., ServiceBusClient]  # (connection, *, retry_total=2) -> client


def make_client(connection: Connection, *, retry_total: int = 2) -> ServiceBusClient:
    """A client for one connection; `retry_total` is the SDK's own retry count per operation."""
    options: dict[str, Any] = {
        "retry_total": retry_total,
        "retry_backoff_factor": 0.5,
        "retry_backoff_max": 4,
    }
    if isinstance(connection, ConnectionStringConnection):
        return servicebus.client(connection_string=connection.connection_string, **options)
    assert isinstance(connection, IdentityConnection)
    # Imported here: azure.identity is only needed for identity-based connections.
    from azure.identity import DefaultAzureCredential, ManagedIdentityCredential

    credential: Any
    if (connection.credential or "").lower() == "managedidentity":
        credential = ManagedIdentityCredential(client_id=connection.client_id)
    else:
        credential = DefaultAzureCredential(managed_identity_client_id=connection.client_id)
    return servicebus.client(
        namespace=connection.fully_qualified_namespace, credential=credential, **options
    )


def without_keep_alive_thread(receiver: _R) -> _R:
    """Keep a receiver's AMQP client from starting the SDK's keep-alive thread.

    With prefetch 0 (host.json's ``prefetchCount``, and the extension's default) the SDK
    (azure-servicebus 7.15, pyamqp) ignores ``keep_alive`` and always starts a thread that
    sleeps in 1 s steps; ``close()`` joins it, so every session the host releases cost up to a
    second before its thread could accept the next one (a burst of sessions waited ~1 s per
    turn; the extension closes a session in one round trip). The host's loops receive all the
    time, so they need no keep-alive. Relies on SDK internals: when they change, this does
    nothing instead of failing.
    """
    create = getattr(receiver, "_create_handler", None)
    if create is None:
        return receiver

    def create_handler(*args: Any, **kwargs: Any) -> None:
        create(*args, **kwargs)
        handler = getattr(receiver, "_handler", None)
        if handler is not None and hasattr(handler, "_keep_alive_interval"):
            handler._keep_alive_interval = 0  # pyamqp starts the thread only when non-zero

    receiver._create_handler = create_handler  # type: ignore[attr-defined]
    return receiver


class OutputValueError(TypeError):
    """A function set an output to something the binding cannot send."""


def to_outgoing_message(value: Any, *, param: str) -> ServiceBusMessage:
    """Encode with azure.functions' own out converter (str or bytes), then build the message.

    A str becomes a text/plain message as the extension's string converter does; bytes go as
    they are.
    """
    try:
        datum = ServiceBusMessageOutConverter.encode(value, expected_type=None)
    except NotImplementedError as exc:
        raise OutputValueError(
            f"output {param!r}: cannot send a {type(value).__name__}; set a str or bytes"
        ) from exc
    if datum.type == "string":
        return ServiceBusMessage(datum.value, content_type="text/plain")
    return ServiceBusMessage(datum.value)


class OutputSender:
    """Sends output binding values; one client and sender per (connection, entity)."""

    def __init__(self, factory: ClientFactory = make_client) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], _SenderEntry] = {}

    def send(self, output: ServiceBusOutput, value: Any) -> int:
        """Send what the function set (None sends nothing); returns the number sent."""
        if value is None:
            return 0
        message = to_outgoing_message(value, param=output.param)
        key = (output.connection.setting, output.entity)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _SenderEntry(self._factory, output)
        entry.send(message)
        return 1

    def close(self) -> None:
        with self._lock:
            entries, self._entries = list(self._entries.values()), {}
        for entry in entries:
            entry.close()


class _SenderEntry:
    def __init__(self, factory: ClientFactory, output: ServiceBusOutput) -> None:
        self._factory = factory
        self._output = output
        self._lock = threading.Lock()
        self._client: ServiceBusClient | None = None
        self._sender: ServiceBusSender | None = None

    def send(self, message: ServiceBusMessage) -> None:
        with self._lock:
            try:
                self._open().send_messages(message)
            except Exception:
                # A broken link stays broken: drop it so the next invocation reconnects.
                self._close_locked()
                raise

    def _open(self) -> ServiceBusSender:
        if self._sender is None:
            self._client = self._factory(self._output.connection)
            if self._output.queue is not None:
                self._sender = self._client.get_queue_sender(self._output.queue)
            else:
                self._sender = self._client.get_topic_sender(str(self._output.topic))
        return self._sender

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        for closable in (self._sender, self._client):
            if closable is not None:
                try:
                    closable.close()
                except Exception as exc:  # noqa: BLE001 - closing a dead link may fail; nothing to save
                    logging.getLogger(__name__).debug("closing sender failed: %r", exc)
        self._sender = self._client = None
