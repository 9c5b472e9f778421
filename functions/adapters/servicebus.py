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
from datetime import datetime
from typing import Any

from azure.servicebus import ServiceBusClient, ServiceBusMessage
from azure.servicebus.exceptions import (
    MessageNotFoundError,
    MessageSizeExceededError,
    ServiceBusError,
)

from functions.shared import write_window
from functions.shared.batching import Batcher
from sebridge import servicebus
from sebridge.contract.commands import ApproveCommand
from sebridge.contract.events import Envelope

log = logging.getLogger("sebridge.functions.servicebus")


class ServiceBusSender:
    """One lazily built client per process and one long-lived sender per entity.

    Opening a sender attaches an AMQP link (and exchanges a token): hundreds of milliseconds
    that every approval would otherwise wait for. An SDK sender is not thread-safe, so the
    invocations of a process take turns on each entity's link; but a burst (fifty events
    prepared at once, each publishing ``Prepared``) would then wait for fifty round trips one
    after another. So the sends of one entity are group-committed (functions.shared.batching):
    the messages that queue up while one send is in flight go together in the next, as one
    batch (``create_message_batch``, split when full), and each caller returns once the broker
    took its own message. One batch holds messages of many sessions with distinct message ids,
    which Service Bus accepts on an entity without partitioning (the forwarder relies on the
    same; infra/modules/servicebus.bicep does not enable partitioning). A message too large on
    its own fails only its own send. A send that fails drops the link and is tried once more
    on a fresh one (a message the broker took the first time is a duplicate the second time,
    and duplicate detection drops it) before the error reaches every caller of that batch.
    """

    def __init__(self, *, namespace: str, connection_string: str, credential: Any = None) -> None:
        self._namespace = namespace
        self._connection_string = connection_string  # a secret: never logged
        self._credential = credential
        self._client: ServiceBusClient | None = None
        self._senders: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()  # the client and the senders' table, not the sends
        self.batches: Batcher[tuple[str, str], ServiceBusMessage, None] = Batcher()
        self._entity_locks: dict[tuple[str, str], threading.Lock] = {}

    def __repr__(self) -> str:
        return f"ServiceBusSender(namespace={self._namespace or '<connection string>'})"

    def _get_client(self) -> ServiceBusClient:
        if self._client is None:
            self._client = servicebus.client(
                namespace=self._namespace,
                connection_string=self._connection_string,
                credential=self._credential,
                retry_total=3,
            )
        return self._client

    def _sender(self, kind: str, name: str) -> Any:
        with self._lock:
            sender = self._senders.get((kind, name))
            if sender is None:
                client = self._get_client()
                sender = (
                    client.get_topic_sender(name)
                    if kind == "topic"
                    else client.get_queue_sender(name)
                )
                self._senders[(kind, name)] = sender
            return sender

    def _drop(self, kind: str, name: str, sender: Any) -> None:
        with self._lock:
            if self._senders.get((kind, name)) is sender:
                del self._senders[(kind, name)]
        try:
            sender.close()
        except Exception as close_exc:  # noqa: BLE001 - a broken link may not close
            log.debug("closing a failed sender: %s", close_exc)

    def _serve(
        self, entity: tuple[str, str], messages: list[ServiceBusMessage]
    ) -> list[BaseException | None]:
        """Send a batch of callers' messages on the entity's link (one caller's thread)."""
        kind, name = entity
        for attempt in (1, 2):
            sender = self._sender(kind, name)
            try:
                return _send_in_batches(sender, messages)
            except ServiceBusError as exc:
                self._drop(kind, name, sender)
                if attempt == 2:
                    raise
                log.warning(
                    "sending to %s %s failed (%s); retrying on a new link",
                    kind,
                    name,
                    type(exc).__name__,
                )
        raise AssertionError("unreachable")

    def _send(self, kind: str, name: str, message: ServiceBusMessage) -> None:
        self.batches.submit((kind, name), message, self._serve)

    def send_to_topic(self, topic: str, message: ServiceBusMessage) -> None:
        self._send("topic", topic, message)

    def send_to_queue(self, queue: str, message: ServiceBusMessage) -> None:
        self._send("queue", queue, message)

    def on_link(self, kind: str, name: str, call: Any) -> Any:
        """``call(sender)`` on the entity's link, one caller at a time (an SDK sender is not
        thread-safe); a ServiceBusError drops the link and is tried once more on a fresh one."""
        with self._lock:
            entity_lock = self._entity_locks.setdefault((kind, name), threading.Lock())
        with entity_lock:
            for attempt in (1, 2):
                sender = self._sender(kind, name)
                try:
                    return call(sender)
                except MessageNotFoundError:
                    raise
                except ServiceBusError as exc:
                    self._drop(kind, name, sender)
                    if attempt == 2:
                        raise
                    log.warning("%s %s: %s; retrying on a new link", kind, name, type(exc).__name__)
        raise AssertionError("unreachable")

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


def _send_in_batches(sender: Any, messages: list[ServiceBusMessage]) -> list[BaseException | None]:
    """Send ``messages`` in as few batches as the link's size limit allows; a message that
    does not fit even in an empty batch gets its MessageSizeExceededError, the rest are sent."""
    results: list[BaseException | None] = [None] * len(messages)
    batch, filled = sender.create_message_batch(), 0
    for index, message in enumerate(messages):
        try:
            batch.add_message(message)
            filled += 1
            continue
        except MessageSizeExceededError as exc:
            if not filled:
                results[index] = exc  # too large on its own
                continue
        sender.send_messages(batch)
        batch, filled = sender.create_message_batch(), 0
        try:
            batch.add_message(message)
            filled += 1
        except MessageSizeExceededError as exc:
            results[index] = exc
    if filled:
        sender.send_messages(batch)
    return results


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
        # An approval decided under a pool's lease goes out only while it is held (a send
        # waits for its batch; the SDK retries on its own, so this is checked before it).
        write_window.before_attempt()
        self._sender.send_to_queue(self._queue, servicebus.command_message(command, session_id))
        log.info("command sent", extra={"messageId": command.message_id, "vm": session_id})


class SdkMomentScheduler:
    """lb-pools' drain moments: messages scheduled on the drain-moments queue
    (``schedule_messages``) and cancelled by sequence number (``cancel_scheduled_messages``)."""

    def __init__(self, sender: ServiceBusSender, queue: str) -> None:
        self._sender, self._queue = sender, queue

    def schedule(self, body: bytes, at: datetime, message_id: str) -> int:
        message = ServiceBusMessage(body, message_id=message_id, content_type="application/json")
        (sequence,) = self._sender.on_link(
            "queue", self._queue, lambda sender: sender.schedule_messages(message, at)
        )
        log.info("drain scheduled", extra={"messageId": message_id, "sequence": sequence})
        return int(sequence)

    def cancel(self, sequence: int) -> None:
        try:
            self._sender.on_link(
                "queue", self._queue, lambda sender: sender.cancel_scheduled_messages(sequence)
            )
        except MessageNotFoundError:
            log.info("scheduled drain %d was delivered or cancelled already", sequence)
            return
        log.info("scheduled drain cancelled", extra={"sequence": sequence})
