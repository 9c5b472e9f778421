"""The poller's document source and the sender's publisher, each wrapped to tell watchers
(:class:`~sebridge.forwarder.observability.observations.Observations`, the metrics) how every
call went.

The wrappers implement the same ports as what they wrap, so the loop does not know they are
there; a watcher that raises is logged and ignored, never the loop's problem.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from sebridge.contract.events import Envelope, Observer
from sebridge.forwarder.observability.observations import poll_result
from sebridge.forwarder.ports import DocumentSource, ImdsError, MessageRefused, Publisher
from sebridge.imds import Document

log = logging.getLogger("forwarder")


class ReadWatcher(Protocol):
    def imds_read(self, seconds: float, result: str) -> None:
        """A scheduled events read took ``seconds`` and ended with ``result`` (POLL_RESULTS)."""


class SendWatcher(Protocol):
    def publish_attempt(self, result: str, count: int) -> None:
        """A publish call ended with ``result`` (PUBLISH_RESULTS) having sent ``count``."""


class Watcher(ReadWatcher, SendWatcher, Protocol):
    """Told of both."""


class ObservedSource:
    """A :class:`DocumentSource` that times each scheduled events read."""

    def __init__(self, source: DocumentSource, watchers: Sequence[ReadWatcher]) -> None:
        self.source = source
        self.watchers = tuple(watchers)

    def get_document(self) -> Document:
        began = time.perf_counter()
        try:
            document = self.source.get_document()
        except ImdsError as exc:
            self._tell(time.perf_counter() - began, poll_result(exc))
            raise
        self._tell(time.perf_counter() - began, "ok")
        return document

    def instance_metadata(self) -> Observer:
        return self.source.instance_metadata()

    def _tell(self, seconds: float, result: str) -> None:
        for watcher in self.watchers:
            try:
                watcher.imds_read(seconds, result)
            except Exception:
                log.exception("IMDS read watcher %r failed; ignored", watcher)


class ObservedPublisher:
    """A :class:`Publisher` that reports each attempt's result."""

    def __init__(self, publisher: Publisher, watchers: Sequence[SendWatcher]) -> None:
        self.publisher = publisher
        self.watchers = tuple(watchers)

    def connect(self) -> None:
        self.publisher.connect()

    def publish(self, envelopes: Sequence[Envelope]) -> int:
        try:
            sent = self.publisher.publish(envelopes)
        except MessageRefused:
            self._tell("refused", 0)
            raise
        except Exception:
            self._tell("failed", 0)
            raise
        self._tell("ok", sent)
        return sent

    def close(self) -> None:
        self.publisher.close()

    def _tell(self, result: str, count: int) -> None:
        for watcher in self.watchers:
            try:
                watcher.publish_attempt(result, count)
            except Exception:
                log.exception("publish watcher %r failed; ignored", watcher)
