"""Where transitions go: the Publisher port and its adapters (Service Bus, dry-run stdout)."""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Sequence
from typing import Any, Protocol, TextIO

from sebridge import servicebus
from sebridge.contract.events import Envelope

log = logging.getLogger(__name__)

SEND_TIMEOUT = 15.0


class PublishError(Exception):
    """Sending failed; the messages stay in the outbox and are retried."""


class Publisher(Protocol):
    def connect(self) -> None:
        """Open the connection ahead of the first message (best effort; raises PublishError)."""

    def publish(self, envelopes: Sequence[Envelope]) -> None:
        """Send all of them, in order, or raise :class:`PublishError`."""

    def close(self) -> None: ...


class DryRunPublisher:
    """``--dry-run``: one JSON object per message on stdout, nothing sent."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()

    def connect(self) -> None:
        return None

    def publish(self, envelopes: Sequence[Envelope]) -> None:
        with self._lock:
            for envelope in envelopes:
                self._stream.write(json.dumps(envelope.to_dict(), separators=(",", ":")) + "\n")
            self._stream.flush()

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
    ) -> None:
        self.topic = topic
        self._namespace = namespace
        self._connection_string = connection_string
        self._client_id = client_id
        self._client: Any = None
        self._sender: Any = None

    def _ensure_sender(self) -> Any:
        if self._sender is None:
            self._client = servicebus.client(
                namespace=self._namespace,
                connection_string=self._connection_string,
                client_id=self._client_id,
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

    def publish(self, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        try:
            sender = self._ensure_sender()
            sender.send_messages(
                [servicebus.envelope_message(e) for e in envelopes], timeout=SEND_TIMEOUT
            )
        except Exception as exc:
            self.close()
            raise PublishError(f"{type(exc).__name__}: {exc}") from exc

    def close(self) -> None:
        for thing in (self._sender, self._client):
            if thing is not None:
                try:
                    thing.close()
                except Exception as exc:  # noqa: BLE001 - closing a broken link may fail too
                    log.debug("closing Service Bus client failed: %s", exc)
        self._sender = None
        self._client = None
