"""The forwarder's loops: poll IMDS -> diff -> outbox -> state; drain the outbox -> publisher.

Detection (the poller), the durable queue (the outbox) and delivery (the sender) are separate
pieces with one type between them, the contract ``Envelope``. The poller never waits on
Service Bus and the sender never waits on IMDS, so an outage of one never delays the other.
Every tick catches and logs what went wrong and goes on; only ``stop`` ends the loops.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime

from sebridge import __version__, lifecycle
from sebridge.contract.events import Envelope, Observer, event_message, heartbeat_message
from sebridge.forwarder.diff import diff, index
from sebridge.forwarder.imds_client import ImdsClient, ImdsError, hostname_observer
from sebridge.forwarder.outbox import Outbox
from sebridge.forwarder.publisher import Publisher, PublishError
from sebridge.forwarder.state import ForwarderState, StateStore, bounded_lives
from sebridge.retry import Backoff

log = logging.getLogger("forwarder")

SEND_BATCH = 100
# IMDS gives as little as 30 s notice (Preempt): a long backoff could miss an event whole.
MAX_POLL_BACKOFF = 5.0
MAX_SEND_BACKOFF = 30.0  # how late delivery can resume after the broker returns
OBSERVER_RETRY_SECONDS = 60.0


def _now() -> datetime:
    return datetime.now(UTC)


class Forwarder:
    def __init__(
        self,
        *,
        imds: ImdsClient,
        store: StateStore,
        outbox: Outbox,
        publisher: Publisher,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 300.0,
        vm_name: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = _now,
    ) -> None:
        self.imds = imds
        self.store = store
        self.outbox = outbox
        self.publisher = publisher
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.vm_name_override = vm_name
        self.clock = clock
        self.now = now
        self.stop_event = threading.Event()
        self.outbox_ready = threading.Event()
        self.state: ForwarderState = store.load()
        released, dropped = outbox.recover(self.state.outbox_seq)
        if released or dropped:
            log.info(
                "outbox after a crash: %d transition(s) covered by the saved state released, "
                "%d not covered dropped (the next poll re-derives them)",
                released,
                dropped,
            )
        self.observer: Observer = hostname_observer()
        self.observer_resolved = False
        self.last_successful_poll: datetime | None = None
        self.polls = 0
        # After a failure never retry faster than 1/s, whatever the poll interval (IMDS 429s).
        self._poll_backoff = Backoff(max(poll_interval, 1.0), MAX_POLL_BACKOFF)
        self._send_backoff = Backoff(1.0, MAX_SEND_BACKOFF)
        self._next_heartbeat = 0.0
        self._next_observer_try = 0.0
        if self.state.events:
            log.info(
                "resuming with %d known event(s) at incarnation %s",
                len(self.state.events),
                self.state.incarnation,
            )

    # -- identity ---------------------------------------------------------------------------
    def resolve_observer(self) -> Observer:
        """Instance metadata once; on failure the hostname, retried every minute."""
        try:
            observer = self.imds.instance_metadata()
            self.observer_resolved = True
        except ImdsError as exc:
            observer = hostname_observer()
            self._next_observer_try = self.clock() + OBSERVER_RETRY_SECONDS
            log.warning(
                "instance metadata unavailable (%s): using hostname %r; retrying in %.0f s",
                exc,
                observer.vm_name,
                OBSERVER_RETRY_SECONDS,
            )
        if self.vm_name_override:
            observer = replace(observer, vm_name=self.vm_name_override)
        self.observer = observer
        return observer

    # -- polling ----------------------------------------------------------------------------
    def poll_once(self) -> float | None:
        """One poll; returns None when it succeeded, else the backoff before the next try."""
        try:
            document = self.imds.get_document()
        except ImdsError as exc:
            delay = self._poll_backoff.next_delay(at_least=exc.retry_after or 0.0)
            log.warning(
                "poll failed (%d in a row): %s; next poll in %.1f s",
                self._poll_backoff.failures,
                exc,
                delay,
            )
            return delay
        self._poll_backoff.reset()
        observed_at = self.now()
        changes = diff(self.state.events, document, observed_at)
        held_up_to = 0
        lives = dict(self.state.lives)
        if changes:
            envelopes = []
            for c in changes:
                life, message_id = lifecycle.advance(
                    lives.pop(c.event.key, None), c.transition.value, c.event
                )
                lives[c.event.key] = life  # re-inserted: the most recently touched come last
                envelopes.append(
                    event_message(
                        c.transition,
                        c.event,
                        self.observer,
                        document.incarnation,
                        observed_at,
                        message_id=message_id,
                        changes=c.changes,
                    )
                )
            # Held until the state that produced them is saved (see Outbox): a crash in
            # between loses nothing and publishes nothing the saved state does not know.
            held_up_to = self.outbox.put(envelopes, hold=True)
            for change, envelope in zip(changes, envelopes, strict=True):
                log.info(
                    "%s %s (%s, %s) incarnation %d",
                    change.transition.value,
                    change.event.event_id,
                    change.event.event_type,
                    change.event.status,
                    document.incarnation,
                    extra={"transition": change.transition.value, "messageId": envelope.message_id},
                )
        if changes or document.incarnation != self.state.incarnation:
            events = index(document.events)
            self.state = ForwarderState(
                document.incarnation,
                events,
                max(self.state.outbox_seq, held_up_to),
                bounded_lives(lives, set(events)),
            )
            self.store.save(self.state)
        if held_up_to:
            self.outbox.release(held_up_to)
            self.outbox_ready.set()
        self.last_successful_poll = observed_at
        self.polls += 1
        return None

    def heartbeat_if_due(self) -> None:
        if self.heartbeat_interval <= 0 or self.clock() < self._next_heartbeat:
            return
        self._next_heartbeat = self.clock() + self.heartbeat_interval
        self.enqueue(
            heartbeat_message(
                self.observer,
                self.now(),
                forwarder_version=__version__,
                last_incarnation=self.state.incarnation,
                outbox_depth=self.outbox.depth(),
                last_successful_poll=self.last_successful_poll,
            )
        )

    def life_of(self, key: str) -> lifecycle.Life | None:
        """What this forwarder remembers of an event (for the ids of what it reports on it)."""
        return self.state.lives.get(key)

    def enqueue(self, envelope: Envelope) -> None:
        self.outbox.put([envelope])
        self.outbox_ready.set()

    def tick(self) -> float | None:
        """poll_once plus housekeeping; never raises. None = on schedule, else a backoff."""
        try:
            if not self.observer_resolved and self.clock() >= self._next_observer_try:
                self.resolve_observer()
            delay = self.poll_once()
            self.heartbeat_if_due()
            return delay
        except Exception:
            log.exception("poll tick failed; going on")
            return self._poll_backoff.next_delay()

    def poll_loop(self) -> None:
        next_at = self.clock()
        while not self.stop_event.is_set():
            backoff = self.tick()
            if backoff is None:
                # Fixed rate: one slow poll does not push every later poll back.
                next_at = max(next_at + self.poll_interval, self.clock())
            else:
                next_at = self.clock() + backoff
            self.stop_event.wait(max(0.0, next_at - self.clock()))

    # -- sending ----------------------------------------------------------------------------
    def send_pending(self) -> int:
        """Send everything pending, in order; returns how many were sent. Raises PublishError."""
        sent = 0
        while not self.stop_event.is_set():
            batch = self.outbox.peek(SEND_BATCH)
            if not batch:
                break
            self.publisher.publish([envelope for _, envelope in batch])
            self.outbox.remove([seq for seq, _ in batch])
            sent += len(batch)
            log.debug("sent %d message(s): %s", len(batch), [e.message_id for _, e in batch])
        return sent

    def send_loop(self) -> None:
        try:
            self.publisher.connect()
        except PublishError as exc:
            log.warning("cannot connect to Service Bus yet (%s): will retry when sending", exc)
        while not self.stop_event.is_set():
            self.outbox_ready.clear()
            try:
                sent = self.send_pending()
                if sent and self._send_backoff.failures:
                    log.info("Service Bus reachable again: sent %d pending message(s)", sent)
                self._send_backoff.reset()
                self.outbox_ready.wait(5.0)
            except PublishError as exc:
                delay = self._send_backoff.next_delay()
                log.warning(
                    "publish failed (%d in a row, %d pending): %s; retrying in %.1f s",
                    self._send_backoff.failures,
                    self.outbox.depth(),
                    exc,
                    delay,
                )
                self.stop_event.wait(delay)
            except Exception:
                log.exception("sender failed; going on")
                self.stop_event.wait(self._send_backoff.next_delay())

    # -- lifecycle --------------------------------------------------------------------------
    def run(self, extra_workers: tuple[Callable[[], None], ...] = ()) -> None:
        self.resolve_observer()
        threads = [threading.Thread(target=self.send_loop, name="sender", daemon=True)]
        threads += [
            threading.Thread(target=worker, name=getattr(worker, "__name__", "worker"), daemon=True)
            for worker in extra_workers
        ]
        for thread in threads:
            thread.start()
        try:
            self.poll_loop()
        finally:
            self.stop_event.set()
            self.outbox_ready.set()
            for thread in threads:
                thread.join(timeout=10.0)

    def run_once(self, send_timeout: float = 30.0) -> bool:
        """``--once``: one poll, then send what is pending. True when both succeeded."""
        self.resolve_observer()
        polled = self.tick() is None
        deadline = self.clock() + send_timeout
        while self.outbox.depth() and self.clock() < deadline:
            try:
                self.send_pending()
            except PublishError as exc:
                log.warning("publish failed: %s", exc)
                time.sleep(min(self._send_backoff.next_delay(), max(0.0, deadline - self.clock())))
        if self.outbox.depth():
            log.error("%d message(s) still pending in the outbox", self.outbox.depth())
        return polled and not self.outbox.depth()

    def stop(self) -> None:
        self.stop_event.set()
        self.outbox_ready.set()
