"""Where transitions go: the Service Bus and dry-run adapters of the Publisher port.

:meth:`ServiceBusPublisher.publish` fills one batch with the SDK's batch API, from the front of
what it is given, until the next message would not fit (the batch size is the configured maximum
message size, Standard's 256 KB by default, or the link's own if that is smaller), sends it and
says how many it sent. A message that cannot be sent even alone (larger than the maximum, or a
value the SDK cannot encode) raises :class:`MessageRefused` so that the sender sets it aside and
goes on with the rest; only a message-level fault does that. Broker, network and identity
failures raise :class:`PublishError` and are retried: they are not the message's fault.
"""

from __future__ import annotations

import json
import logging
import struct
import sys
import threading
from collections.abc import Sequence
from typing import Any, TextIO

from sebridge import servicebus
from sebridge.contract.events import Envelope
from sebridge.forwarder.ports import MessageRefused, PublishError

log = logging.getLogger(__name__)

SEND_TIMEOUT = 15.0
STANDARD_MAX_MESSAGE_BYTES = 256 * 1024  # Service Bus Standard; Premium allows more

__all__ = [
    "STANDARD_MAX_MESSAGE_BYTES",
    "DryRunPublisher",
    "MessageRefused",
    "PublishError",
    "ServiceBusPublisher",
]

# What building or encoding one message can raise when a value is beyond what AMQP or the SDK
# takes (an int property outside int32, a lone surrogate, an id over 128 characters).
_ENCODING_ERRORS = (ValueError, TypeError, OverflowError, UnicodeError, struct.error)


class DryRunPublisher:
    """``--dry-run``: one JSON object per message on stdout, nothing sent."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()

    def connect(self) -> None:
        return None

    def publish(self, envelopes: Sequence[Envelope]) -> int:
        with self._lock:
            for envelope in envelopes:
                self._stream.write(json.dumps(envelope.to_dict(), separators=(",", ":")) + "\n")
            self._stream.flush()
        return len(envelopes)

    def close(self) -> None:
        return None


class ServiceBusPublisher:
    """Sends to the topic with one long-lived sender, rebuilt after any failure."""

    def __init__(
        self,
        topic: str,
        *,
        namespace: str | None = None,
        connection_string: str | None = None,
        client_id: str | None = None,
        credential: Any = None,
        max_message_size: int = STANDARD_MAX_MESSAGE_BYTES,
        transport: str = "amqp",
        endpoint: str | None = None,
    ) -> None:
        self.topic = topic
        self.max_message_size = max_message_size
        self.transport = transport
        self.endpoint = endpoint
        self._namespace = namespace
        self._connection_string = connection_string
        self._client_id = client_id
        self._credential = credential  # None: servicebus.client's (DefaultAzureCredential)
        self._client: Any = None
        self._sender: Any = None

    def _ensure_sender(self) -> Any:
        if self._sender is None:
            self._client = servicebus.client(
                namespace=self._namespace,
                connection_string=self._connection_string,
                client_id=self._client_id,
                credential=self._credential,
                transport=self.transport,
                endpoint=self.endpoint,
                retry_total=1,
                retry_backoff_factor=0.5,
            )
            self._sender = self._client.get_topic_sender(self.topic)
        return self._sender

    def connect(self) -> None:
        """Open the AMQP link now: when an event appears, every VM that sees it publishes at
        the same moment, and connecting first would add seconds to the first message."""
        try:
            self._ensure_sender().__enter__()  # the SDK's public way to open a sender
        except Exception as exc:
            self.close()
            raise PublishError(f"{type(exc).__name__}: {exc}") from exc

    def _new_batch(self, sender: Any) -> Any:
        try:
            return sender.create_message_batch(max_size_in_bytes=self.max_message_size)
        except ValueError:
            # The link allows less than the setting (it says so when it opens): use the link's.
            return sender.create_message_batch()

    def publish(self, envelopes: Sequence[Envelope]) -> int:
        if not envelopes:
            return 0
        from azure.servicebus.exceptions import MessageSizeExceededError

        try:
            sender = self._ensure_sender()
            batch = self._new_batch(sender)
        except Exception as exc:
            self.close()
            raise PublishError(f"{type(exc).__name__}: {exc}") from exc
        for envelope in envelopes:
            try:
                batch.add_message(servicebus.envelope_message(envelope))
            except MessageSizeExceededError as exc:
                if len(batch) == 0:
                    raise MessageRefused(
                        f"larger than the maximum message size "
                        f"({batch.max_size_in_bytes} bytes) even alone"
                    ) from exc
                break  # full: this one starts the next batch
            except _ENCODING_ERRORS as exc:
                if len(batch) == 0:
                    raise MessageRefused(
                        f"the Service Bus SDK cannot encode it: {type(exc).__name__}: {exc}"
                    ) from exc
                break  # send what is before it; alone next time, it is refused
        try:
            sender.send_messages(batch, timeout=SEND_TIMEOUT)
        except MessageSizeExceededError as exc:
            # The broker's limit is below what the link announced (or the setting): never
            # retry the same batch. One message alone that the broker refuses is set aside.
            if len(batch) == 1:
                raise MessageRefused(f"refused by Service Bus as too large: {exc}") from exc
            return self._send_one_by_one(envelopes[: len(batch)])
        except Exception as exc:
            self.close()
            raise PublishError(f"{type(exc).__name__}: {exc}") from exc
        return len(batch)

    def _send_one_by_one(self, envelopes: Sequence[Envelope]) -> int:
        """After the broker refused a batch as too large: the front messages one at a time,
        until one fails (it is refused if it is the first, else the next call starts at it)."""
        from azure.servicebus.exceptions import MessageSizeExceededError

        sent = 0
        for envelope in envelopes:
            try:
                self._ensure_sender().send_messages(
                    servicebus.envelope_message(envelope), timeout=SEND_TIMEOUT
                )
            except MessageSizeExceededError as exc:
                if sent == 0:
                    raise MessageRefused(f"refused by Service Bus as too large: {exc}") from exc
                return sent
            except Exception as exc:
                self.close()
                if sent:
                    return sent
                raise PublishError(f"{type(exc).__name__}: {exc}") from exc
            sent += 1
        return sent

    def close(self) -> None:
        for thing in (self._sender, self._client):
            if thing is not None:
                try:
                    thing.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken link may fail too
                    log.debug("closing Service Bus client failed: %s", exc)
        self._sender = None
        self._client = None
