"""The ports of the forwarder's loop: what it touches, as small protocols.

The loop (:class:`sebridge.forwarder.service.Forwarder`) sees only these; the production
adapters are :class:`~sebridge.forwarder.imds.client.ImdsClient`,
:class:`~sebridge.forwarder.state.StateStore`, :class:`~sebridge.forwarder.delivery.outbox.Outbox`
and the publishers of :mod:`sebridge.forwarder.delivery.publisher`, wired in ``main.py``; tests
run the same loop in-process against in-memory fakes (``tests/support/forwarder_fakes.py``).

Errors that cross a port: :class:`ImdsError` (the document source), ``OutboxError`` (the outbox),
any ``Exception`` from :meth:`StateSaver.save` (a failed save: the loop keeps the transitions
held and retries on every poll), :class:`PublishError` (a transient publishing failure: retried
with backoff) and :class:`MessageRefused` (this one message can never be sent: set aside).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from sebridge.contract.events import Envelope, Observer
from sebridge.imds import Document

if TYPE_CHECKING:
    from sebridge.forwarder.observability.health import Health
    from sebridge.forwarder.state import ForwarderState


class ImdsError(Exception):
    """An IMDS request failed; ``transient`` says whether retrying can help, ``status`` is the
    HTTP status IMDS answered (None when it did not answer, or answered 200 with a bad body)."""

    def __init__(
        self,
        message: str,
        *,
        transient: bool,
        retry_after: float | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.retry_after = retry_after
        self.status = status


class PublishError(Exception):
    """Sending failed for a reason that is not the message's (broker, network, identity); the
    messages stay in the outbox and are retried."""


class MessageRefused(Exception):
    """The first message given can never be sent, even alone; the reason says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DocumentSource(Protocol):
    """IMDS as the poller sees it (raises ``ImdsError``)."""

    def get_document(self) -> Document: ...

    def instance_metadata(self) -> Observer: ...


class StateSaver(Protocol):
    def load(self) -> ForwarderState: ...

    def save(self, state: ForwarderState) -> None: ...


class OutboxPort(Protocol):
    """The durable queue between the poller and the sender (raises ``OutboxError``)."""

    def put(self, envelopes: Sequence[Envelope], *, hold: bool = False) -> int: ...

    def release(self, up_to: int) -> None: ...

    def recover(self, saved_up_to: int) -> tuple[int, int]: ...

    def peek(self, limit: int) -> list[tuple[int, Envelope]]: ...

    def remove(self, seqs: Sequence[int]) -> None: ...

    def set_aside(self, seq: int, reason: str) -> None: ...

    def aside_count(self) -> int: ...

    def depth(self) -> int: ...


class Publisher(Protocol):
    def connect(self) -> None:
        """Open the connection ahead of the first message (best effort; raises PublishError)."""

    def publish(self, envelopes: Sequence[Envelope]) -> int:
        """Send a non-empty prefix of ``envelopes`` (in order, as many as one batch holds) and
        return its length; raise :class:`MessageRefused` when the first one cannot be sent even
        alone, :class:`PublishError` when nothing was sent for any other reason."""

    def close(self) -> None: ...


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds for pacing (never jumps)."""

    def now(self) -> datetime:
        """Wall-clock time, aware, for observation times (persisted across restarts)."""


class SystemClock:
    def monotonic(self) -> float:
        import time

        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


class LoopListener(Protocol):
    """What the loop tells anyone plugged into it (metrics, health endpoints, local hooks).

    Called on the poller's thread; a listener must return quickly and never raise (an
    exception is logged and ignored). A listener may also have
    ``document_observed(document, observer, observed_at)``: every document a poll read, told
    before anything of it is written (the local actions follow documents, not deliveries),
    ``poll_recorded()``: that poll's transitions are in the outbox, and
    ``command_settled(message_id, action, reason)``."""

    def transitions_recorded(self, envelopes: Sequence[Envelope]) -> None:
        """Transitions just derived from a poll and written to the outbox (held until their
        state is saved, then sent in order)."""

    def polled(self, health: Health) -> None:
        """After every poll tick, successful or not."""


class StoppedWhileParked(Exception):
    """The forwarder stopped, and may have closed its state, while this thread was parked in
    a call (``Forwarder.parked``): the thread must return without touching anything."""
