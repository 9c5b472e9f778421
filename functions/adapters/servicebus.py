"""Sending to Service Bus with the azure-servicebus SDK.

The Python worker's Service Bus *output binding* takes only a body: it cannot set message_id
or session_id, and both matter here (duplicate detection collapses replays by message_id; the
approvals queue and the topic's subscriptions are session-enabled). So commands and
``Prepared`` are sent with the SDK, from the same connection settings the triggers use:
``ServiceBusConnection__fullyQualifiedNamespace`` with DefaultAzureCredential (managed identity
in Azure), or a ``ServiceBusConnection`` connection string (the local emulator).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import ServiceBusError

from sebridge import servicebus
from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope

log = logging.getLogger("sebridge.functions.servicebus")


class ServiceBusSender:
    """One lazily built client per process and one long-lived sender per entity.

    Opening a sender attaches an AMQP link (and exchanges a token): hundreds of milliseconds
    that every approval would otherwise wait for. Sends through one sender are serialized
    (SDK senders are not thread-safe; a send takes milliseconds); a sender that fails is
    dropped and the send tried once more on a fresh one before the error propagates.
    """

    def __init__(self, *, namespace: str, connection_string: str, credential: Any = None) -> None:
        self._namespace = namespace
        self._connection_string = connection_string  # a secret: never logged
        self._credential = credential
        self._client: ServiceBusClient | None = None
        self._senders: dict[tuple[str, str], Any] = {}
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"ServiceBusSender(namespace={self._namespace or '<connection string>'})"

    def _get_client(self) -> ServiceBusClient:
        with self._lock:
            if self._client is None:
                self._client = servicebus.client(
                    namespace=self._namespace,
                    connection_string=self._connection_string,
                    credential=self._credential,
                    retry_total=3,
                )
            return self._client

    def _sender(self, kind: str, name: str) -> Any:
        sender = self._senders.get((kind, name))
        if sender is None:
            client = self._get_client()
            sender = (
                client.get_topic_sender(name) if kind == "topic" else client.get_queue_sender(name)
            )
            self._senders[(kind, name)] = sender
        return sender

    def _send(self, kind: str, name: str, message: ServiceBusMessage) -> None:
        with self._lock:
            for attempt in (1, 2):
                sender = self._sender(kind, name)
                try:
                    sender.send_messages(message)
                    return
                except ServiceBusError as exc:
                    self._senders.pop((kind, name), None)
                    try:
                        sender.close()
                    except Exception as close_exc:  # noqa: BLE001 - a broken link may not close
                        log.debug("closing a failed sender: %s", close_exc)
                    if attempt == 2:
                        raise
                    log.warning(
                        "sending to %s %s failed (%s); retrying on a new link",
                        kind,
                        name,
                        type(exc).__name__,
                    )

    def send_to_topic(self, topic: str, message: ServiceBusMessage) -> None:
        self._send("topic", topic, message)

    def send_to_queue(self, queue: str, message: ServiceBusMessage) -> None:
        self._send("queue", queue, message)

    def close(self) -> None:
        with self._lock:
            for sender in self._senders.values():
                try:
                    sender.close()
                except Exception as exc:  # noqa: BLE001
                    log.debug("closing a sender: %s", exc)
            self._senders.clear()
            if self._client is not None:
                self._client.close()
                self._client = None


class SdkTopicPublisher:
    def __init__(self, sender: ServiceBusSender, topic: str) -> None:
        self._sender, self._topic = sender, topic

    def publish(self, envelope: Envelope) -> None:
        self._sender.send_to_topic(self._topic, servicebus.envelope_message(envelope))
        log.info("published", extra={"messageId": envelope.message_id})


class SdkCommandSender:
    def __init__(self, sender: ServiceBusSender, queue: str) -> None:
        self._sender, self._queue = sender, queue

    def send(self, command: ApproveCommand, session_id: str) -> None:
        self._sender.send_to_queue(self._queue, servicebus.command_message(command, session_id))
        log.info("command sent", extra={"messageId": command.message_id, "vm": session_id})
