"""The forwarder's loops: poll IMDS -> diff -> outbox -> state; drain the outbox -> publisher.

Detection (the poller), the durable queue (the outbox) and delivery (the sender) are separate
pieces with one type between them, the contract ``Envelope``. The poller never waits on
Service Bus and the sender never waits on IMDS, so an outage of one never delays the other.
Every tick catches and logs what went wrong and goes on; only ``stop`` ends the loops. The loop
sees only ports (:mod:`sebridge.forwarder.ports`), so it runs in-process against fakes.

What each fault does (docs/reliability.md, "Reliability"):

- IMDS fails: the poll is retried with backoff (1 to 5 s); nothing else changes.
- The outbox cannot be written (disk full): the poll's transitions are not recorded and the
  in-memory state does not move, so the next poll derives them again.
- The state file cannot be saved (disk full, no inodes, read-only): the transitions stay held
  in the outbox while the in-memory state moves on; the save is retried on every poll tick
  until it succeeds, and the held transitions are released by that same tick. Heartbeats say
  so (``health.stateSaveFailing``) while it lasts. A crash meanwhile loses nothing: the held
  rows are dropped at start and derived again from the last saved state.
- A message cannot be sent even alone: it is set aside (kept in the outbox's aside table with
  the reason, logged at ERROR, counted in Heartbeats) and delivery of the rest goes on.
- Service Bus fails otherwise: retried with backoff (1 to 30 s), in order.

Heartbeats are liveness only: the latest one waits in memory (never behind a full disk) and is
sent after the pending transitions.

A message never leaves the VM without its identity (instance metadata: vmId, resource id; the
workflows' scope check refuses a message without them). One check says what is an identity
(:func:`sebridge.forwarder.state.is_identity`: both named): an answer that names the VM only is
retried like a failure and said at ERROR (then every :data:`IDENTITY_REMINDER_SECONDS`). The lookup
runs on a thread of its own (``identity``), retried with backoff from 1 s up to
:data:`OBSERVER_RETRY_SECONDS`, so a lookup that hangs never delays a poll. Until it succeeds,
transitions wait in the outbox and no Heartbeat is built; the local actions (drain probe, hooks,
Prepared) judge this VM's events by one notion of this VM, :attr:`Forwarder.local_observer`: the
identity an earlier run resolved (kept in the state file), else the host name; when the identity
resolves they re-evaluate their view under it. Then every message built without an identity (no vmId
nor resource id: under whatever host name or ``--vm-name`` it was built) is rebound to the VM's
identity as it is sent (same message id), rows left in the outbox by an earlier run included. Only
an IMDS that answers 404 (it serves no instance metadata at all: not Azure's, e.g. Microsoft's mock
server) lets messages go out under the host name, said at ERROR.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sebridge import __version__, lifecycle
from sebridge.contract import tracecontext
from sebridge.contract.events import (
    Envelope,
    Observer,
    Transition,
    built_without_identity,
    event_message,
    heartbeat_message,
    measured_message,
    with_observer,
)
from sebridge.forwarder.delivery.outbox import OutboxError
from sebridge.forwarder.imds.client import hostname_observer
from sebridge.forwarder.imds.diff import diff, remember
from sebridge.forwarder.imds.impact import ImpactMeter
from sebridge.forwarder.observability.health import ConditionLog, Health, OddValueLog
from sebridge.forwarder.ports import (
    Clock,
    DocumentSource,
    ImdsError,
    LoopListener,
    MessageRefused,
    OutboxPort,
    Publisher,
    PublishError,
    StateSaver,
    StoppedWhileParked,
    SystemClock,
)
from sebridge.forwarder.state import (
    MAX_SHOWN_ID,
    ForwarderState,
    RecentTransition,
    bounded_lives,
    is_identity,
    recent_transitions,
)
from sebridge.imds import Document
from sebridge.retry import Backoff

log = logging.getLogger("forwarder")

PEEK_ROWS = 100  # outbox rows handed to the publisher at a time (it sends what one batch holds)
# IMDS gives as little as 30 s notice (Preempt): a long backoff could miss an event whole.
MAX_POLL_BACKOFF = 5.0
MAX_SEND_BACKOFF = 30.0  # how late delivery can resume after the broker returns
OBSERVER_RETRY_SECONDS = 60.0  # the longest wait between two instance metadata lookups
# An identity that cannot be known (IMDS serves none, or answers without vmId or resource id)
# is said at ERROR when it starts, then again this often while it lasts.
IDENTITY_REMINDER_SECONDS = 900.0
FIRST_LOOKUP_SECONDS = 2.0  # the most the first poll waits for the first identity lookup
# The VM's identity: looked up (instance metadata), not yet known (transitions wait for it), or
# not served by this IMDS at all (404: messages go out under the host name).
RESOLVED, UNKNOWN, ABSENT = "resolved", "unknown", "absent"
MAX_UNSENT_APPROVED = 100
# Seconds for every thread to end after stop (SIGTERM exits within 5 s). The poller and the
# sender end within a quarter second; the approvals receiver is usually inside a receive call
# that waits up to 20 s for a command: it is left behind, parked (Forwarder.parked), and the
# stop closes the outbox and the local actions all the same.
JOIN_TIMEOUT = 2.0


class Forwarder:
    def __init__(
        self,
        *,
        imds: DocumentSource,
        store: StateSaver,
        outbox: OutboxPort,
        publisher: Publisher,
        clock: Clock | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 300.0,
        vm_name: str | None = None,
        fallback_observer: Callable[[], Observer] = hostname_observer,
        listeners: Sequence[LoopListener] = (),
        stop_event: threading.Event | None = None,
    ) -> None:
        """``stop_event`` is set to stop the loops (give the same event to the IMDS clients as
        their ``cancel``, so that a request in progress ends with them)."""
        self.imds = imds
        self.store = store
        self.outbox = outbox
        self.publisher = publisher
        self.clock: Clock = clock or SystemClock()
        self.poll_interval = poll_interval
        self.heartbeat_interval = heartbeat_interval
        self.vm_name_override = vm_name
        self.fallback_observer = fallback_observer
        self.listeners = list(listeners)
        self.stop_event = stop_event or threading.Event()
        self.outbox_ready = threading.Event()
        # Threads parked in a call that touches none of the forwarder's state (parked()), and
        # whether the stop has begun closing it: both under _parking.
        self._parking = threading.Lock()
        self._parked: set[threading.Thread] = set()
        self._closing = False
        # What run() left behind outside a parking: the outbox and the local actions must not
        # be closed under them.
        self.left_in_use: list[str] = []
        self._first_lookup = threading.Event()  # set once instance metadata answered or failed
        self.state: ForwarderState = store.load()
        released, dropped = outbox.recover(self.state.outbox_seq)
        if released or dropped:
            log.info(
                "outbox after a crash: %d transition(s) covered by the saved state released, "
                "%d not covered dropped (the next poll re-derives them)",
                released,
                dropped,
            )
        # The highest outbox row covered by the state on disk, and the highest released.
        self._saved_seq = self.state.outbox_seq
        self._released_seq = self.state.outbox_seq
        # What maintenance costs this VM, measured from its polls (docs/monitoring.md).
        self.impact = ImpactMeter(self.state.impacts, last_observed=self.state.observed_at)
        self._fallback = self._with_override(fallback_observer())
        self.observer: Observer = self._fallback
        self.identity = UNKNOWN
        # Since when the identity is unknown (None once known): health says so.
        self.identity_unknown_since: datetime | None = self.clock.now()
        # The identity an earlier run resolved (state file, or the local actions' journal):
        # what the local actions judge this VM's events by until instance metadata answers.
        self.last_identity: Observer | None = (
            self._with_override(self.state.identity) if self.state.identity else None
        )
        # True while the identity worker looks the identity up off the poll thread (run());
        # otherwise tick() does it (run_once and tests driving tick()).
        self._identity_worker = False
        self._observer_backoff = Backoff(1.0, OBSERVER_RETRY_SECONDS)
        self.last_successful_poll: datetime | None = None
        self.polls = 0
        # After a failure never retry faster than 1/s, whatever the poll interval (IMDS 429s).
        self._poll_backoff = Backoff(max(poll_interval, 1.0), MAX_POLL_BACKOFF)
        self._send_backoff = Backoff(1.0, MAX_SEND_BACKOFF)
        self._next_heartbeat = 0.0
        self._next_observer_try = 0.0
        self._observer_log = ConditionLog(
            log, remind_every=IDENTITY_REMINDER_SECONDS, clock=self.clock.monotonic
        )
        self._outbox_log = ConditionLog(log, logging.ERROR)
        self._odd_values = OddValueLog(log)
        self.save_failing_since: datetime | None = None
        self.save_failures = 0
        self.outbox_failing_since: datetime | None = None
        self.last_error: str | None = None
        self._lock = threading.Lock()  # the heartbeat slot and the unsent Approved messages
        self._heartbeat: Envelope | None = None
        self._unsent: list[Envelope] = []
        # Sessions whose transitions a poll derived and has not recorded in the outbox yet: the
        # forwarder's own messages for them (deliver) wait (the outbox keeps per-session order).
        self._record_lock = threading.Lock()
        self._unrecorded: frozenset[str] = frozenset()
        self.crashed = False  # a loop thread ended by itself (a bug): main exits non-zero
        if self.state.events:
            log.info(
                "resuming with %d known event(s) at incarnation %s",
                len(self.state.events),
                self.state.incarnation,
            )

    # -- identity ---------------------------------------------------------------------------
    def _with_override(self, observer: Observer) -> Observer:
        if self.vm_name_override:
            return replace(observer, vm_name=self.vm_name_override)
        return observer

    @property
    def local_observer(self) -> Observer:
        """This VM, for the actions taken on it (hooks, drain probe, Prepared): the resolved
        identity, else the last known one (an earlier run's), else the host-name fallback."""
        if self.identity == RESOLVED:
            return self.observer
        return self.last_identity or self._fallback

    def remember_identity(self, observer: Observer | None) -> None:
        """An identity known from elsewhere (the local actions' journal), used until instance
        metadata answers when the state file holds none."""
        if self.last_identity is None and observer is not None and is_identity(observer):
            self.last_identity = self._with_override(observer)

    @property
    def observer_resolved(self) -> bool:
        return self.identity == RESOLVED

    @property
    def identity_known(self) -> bool:
        """Whether messages may go out: the VM's identity is known, or IMDS serves none."""
        return self.identity != UNKNOWN

    def resolve_observer(self) -> Observer:
        """Instance metadata; on failure the host name meanwhile, looked up again with backoff
        (1 s, doubling, up to OBSERVER_RETRY_SECONDS, with jitter). The failure is logged when
        it starts and when it changes, not at every retry."""
        try:
            found = self.imds.instance_metadata()
        except ImdsError as exc:
            return self._lookup_failed(exc)
        if not is_identity(found):
            # A 200 with a name but no vmId or resource id: not the VM's identity (the
            # workflows' scope check would refuse every message built with it).
            return self._lookup_failed(
                ImdsError(
                    f"instance metadata names VM {found.vm_name!r} but no vmId or no resource id",
                    transient=True,
                    status=200,
                )
            )
        self.observer = self._with_override(found)  # before the sender may see RESOLVED
        self.last_identity = self.observer
        self.identity = RESOLVED
        self.identity_unknown_since = None
        if self.last_error and self.last_error.startswith("instance metadata:"):
            self.last_error = None  # what failed succeeded
        self._observer_backoff.reset()
        self._observer_log.clear(
            f"instance metadata available: VM name {found.vm_name!r}; messages go out with it"
        )
        self.outbox_ready.set()  # what waited for the identity goes out now
        self._first_lookup.set()
        return self.observer

    def _lookup_failed(self, exc: ImdsError) -> Observer:
        """The identity is not known: the host name meanwhile, looked up again with backoff."""
        self._first_lookup.set()
        delay = self._observer_backoff.next_delay()
        self._next_observer_try = self.clock.monotonic() + delay
        self.observer = self._fallback
        self.last_error = f"instance metadata: {exc}"
        name = self._fallback.vm_name
        if exc.status == 404:
            self.identity = ABSENT
            self._observer_log.report(
                f"instance metadata unavailable ({exc}): this IMDS serves none, so messages "
                f"go out as {name!r} without vmId or resource id, and the workflows' scope "
                f"check will refuse them; looked up again every {OBSERVER_RETRY_SECONDS:.0f} "
                "s at most",
                logging.ERROR,
            )
        else:
            self.identity = UNKNOWN
            local = self.local_observer.vm_name
            self._observer_log.report(
                f"instance metadata unavailable ({exc}): transitions wait in the outbox until "
                f"the VM's identity is known (the drain probe and hooks go on as {local!r}); "
                f"looked up again with backoff, every {OBSERVER_RETRY_SECONDS:.0f} s at most",
                # An answer without the identity is no outage that ends by itself: said at
                # ERROR (and reminded of) like an IMDS that serves none.
                logging.ERROR if exc.status == 200 else None,
            )
        return self.observer

    def _bound(self, envelope: Envelope) -> Envelope:
        """``envelope`` with the VM's identity if it was built under a fallback (no vmId nor
        resource id: the host name or ``--vm-name`` of this run or of an earlier one) before the
        identity was known."""
        if (
            self.identity == RESOLVED
            and is_identity(self.observer)
            and built_without_identity(envelope)
        ):
            return with_observer(envelope, self.observer)
        return envelope

    def identity_loop(self) -> None:
        """The identity worker (:meth:`run`): looks instance metadata up until it answers, with
        the backoff of :meth:`resolve_observer`, off the poll thread: a lookup that hangs (up to
        the IMDS client's deadline) never delays a poll."""
        while not self.stop_event.is_set():
            if self.identity == RESOLVED:
                # Resolved for the process's life: nothing more to look up. (This loop used to
                # go on waking 20 times a second, 2.5x a dry-run forwarder's whole idle CPU.)
                self.stop_event.wait()
                return
            if self.clock.monotonic() >= self._next_observer_try:
                try:
                    self.resolve_observer()
                except Exception:
                    log.exception("instance metadata lookup failed; going on")
                    self._next_observer_try = (
                        self.clock.monotonic() + self._observer_backoff.next_delay()
                    )
                continue
            wait = self._next_observer_try - self.clock.monotonic()
            self.stop_event.wait(min(max(wait, 0.05), 1.0))

    # -- polling ----------------------------------------------------------------------------
    def poll_once(self) -> float | None:
        """One poll; returns None when it is on schedule, else the backoff before the next."""
        self._flush_unsent()
        self.impact.poll_started(self.clock.monotonic(), self.clock.now())
        try:
            document = self.imds.get_document()
        except ImdsError as exc:
            self._save_if_failing()  # a failed save is retried on every tick, IMDS or not
            delay = self._poll_backoff.next_delay(at_least=exc.retry_after or 0.0)
            self.impact.expect(delay)
            self.last_error = str(exc)
            log.warning(
                "poll failed (%d in a row): %s; next poll in %.1f s",
                self._poll_backoff.failures,
                exc,
                delay,
            )
            return delay
        self._poll_backoff.reset()
        self.impact.expect(self.poll_interval)  # fixed rate: the next poll starts one interval on
        observed_at = self.clock.now()
        self._odd_values.document(document)
        # Before, and independently of, the outbox and the state file: the local actions follow
        # what IMDS shows whatever the disk, the outbox or the broker do.
        # Until this poll's transitions are recorded, no message of the forwarder's own for
        # any of these events goes in before them (deliver: per-session order).
        with self._record_lock:
            self._unrecorded = self._unrecorded | {
                lifecycle.event_ref(event.event_id)
                for event in (*document.events, *self.state.events.values())
            }
        self._tell_document(document, observed_at)
        before = self.state
        changes = diff(before.events, document, observed_at, last_seen=before.observed_at)
        self.impact.observed(
            before.events, document.events, self.local_observer.vm_name, observed_at
        )
        lives = dict(before.lives)
        envelopes: list[Envelope] = []  # one per change, in order
        reports: list[Envelope] = []  # this VM's measurements of the events that completed
        for change in changes:
            life, message_id = lifecycle.advance(
                lives.pop(change.event.key, None), change.transition.value, change.event
            )
            lives[change.event.key] = life  # re-inserted: the most recently touched come last
            measured = (
                self.impact.measurement(change.event.key)
                if change.transition is Transition.COMPLETED
                else None
            )
            envelopes.append(
                event_message(
                    change.transition,
                    change.event,
                    self.observer,
                    document.incarnation,
                    observed_at,
                    message_id=message_id,
                    changes=change.changes,
                    impact=measured.to_data() if measured is not None else None,
                )
            )
            if measured is not None:
                # The Completed is one message for the whole set (its id is the event's); this
                # VM's own measurement goes in a message of its own (contract: Measured).
                reports.append(
                    measured_message(
                        change.event,
                        self.observer,
                        document.incarnation,
                        observed_at,
                        appearance=life.appearance,
                        impact=measured.to_data(),
                    )
                )
        held_up_to = 0
        if envelopes:
            # Held until the state that produced them is saved (see Outbox): a crash in
            # between loses nothing and publishes nothing the saved state does not know.
            try:
                held_up_to = self.outbox.put([*envelopes, *reports], hold=True)
            except OutboxError as exc:
                # Nothing of this poll is recorded and the state stays where it was: the next
                # poll derives these transitions again.
                if self.outbox_failing_since is None:
                    self.outbox_failing_since = observed_at
                self.last_error = f"outbox write: {exc}"
                self._outbox_log.report(
                    f"cannot write the outbox ({exc}): {len(envelopes)} transition(s) not "
                    "recorded yet; derived again on every poll until it can"
                )
                with self._record_lock:  # these wait to be recorded by a later poll
                    self._unrecorded = frozenset(envelope.session_id for envelope in envelopes)
                self._save_if_failing()
                return None
        with self._record_lock:
            self._unrecorded = frozenset()
        if self.outbox_failing_since is not None:
            self.outbox_failing_since = None
            self._outbox_log.clear("outbox writable again")
        events = remember(before.events, document.events)
        self.state = ForwarderState(
            document.incarnation,
            events,
            max(before.outbox_seq, held_up_to),
            bounded_lives(lives, {e.key for e in document.events}),
            observed_at,
            self.impact.keep_only(events),
            self.last_identity if self.identity == RESOLVED else before.identity,
            recent_transitions(
                before.transitions,
                [
                    RecentTransition(
                        envelope.session_id,
                        change.event.event_id[:MAX_SHOWN_ID],
                        change.transition.value,
                        envelope.message_id,
                        observed_at,
                    )
                    for change, envelope in zip(changes, envelopes, strict=True)
                ],
            ),
        )
        if (
            changes
            or document.incarnation != before.incarnation
            or self.state.identity != before.identity
            or self.save_failing_since is not None
            or self.impact.wants_save(
                events.values(),
                self.local_observer.vm_name,
                observed_at,
                self.clock.monotonic(),
            )
        ):
            self._save()
        self._release_saved()
        self._tell_recorded()
        for change, envelope in zip(changes, envelopes, strict=True):
            log.info(
                "%s %s (%s, %s) incarnation %s",
                change.transition.value,
                change.event.event_id,
                change.event.event_type,
                change.event.status,
                document.incarnation,
                extra={
                    "transition": change.transition.value,
                    "messageId": envelope.message_id,
                    **tracecontext.log_fields(
                        tracecontext.from_properties(envelope.application_properties)
                    ),
                },
            )
        for report in reports:
            impact = report.body["data"]["impact"]
            log.info(
                "Measured %s: %s s (%s)",
                report.body.get("subject"),
                impact["measuredSeconds"],
                impact["method"],
                extra={"transition": report.subject, "messageId": report.message_id},
            )
        if envelopes:
            self._notify(lambda listener: listener.transitions_recorded(envelopes))
        self.last_successful_poll = observed_at
        self.polls += 1
        return None

    def _save(self) -> bool:
        """Save the in-memory state; on failure it stays unsaved and is retried every tick."""
        try:
            self.store.save(self.state)
        except Exception as exc:  # noqa: BLE001 - any failure: the state is unsaved
            self.save_failures += 1
            self.last_error = f"state save: {type(exc).__name__}: {exc}"
            if self.save_failing_since is None:
                self.save_failing_since = self.clock.now()
                log.error(
                    "cannot save the state file (%s: %s): transitions from now on are kept in "
                    "the outbox but held back; the save is retried on every poll and releases "
                    "them as soon as it succeeds",
                    type(exc).__name__,
                    exc,
                )
            else:
                log.debug("state save failed again (%d): %s", self.save_failures, exc)
            return False
        if self.save_failing_since is not None:
            log.warning(
                "state saved again after %d failed attempt(s) since %s: held transitions released",
                self.save_failures,
                self.save_failing_since.isoformat(),
            )
            self.save_failing_since = None
            self.save_failures = 0
        self._saved_seq = self.state.outbox_seq
        self.impact.saved(self.clock.monotonic())
        return True

    def _save_if_failing(self) -> None:
        if self.save_failing_since is not None and self._save():
            self._release_saved()

    def _release_saved(self) -> None:
        if self._saved_seq <= self._released_seq:
            return
        try:
            self.outbox.release(self._saved_seq)
        except OutboxError as exc:
            self.last_error = f"outbox release: {exc}"
            self._outbox_log.report(f"cannot release saved transitions ({exc}): retried")
            return
        self._released_seq = self._saved_seq
        self.outbox_ready.set()

    def health(self) -> Health:
        try:
            depth: int | None = self.outbox.depth()
            aside = self.outbox.aside_count()
        except OutboxError:
            depth, aside = None, 0
        return Health(
            last_successful_poll=self.last_successful_poll,
            polls=self.polls,
            poll_failures=self._poll_backoff.failures,
            state_save_failing_since=self.save_failing_since,
            outbox_write_failing_since=self.outbox_failing_since,
            publish_failures=self._send_backoff.failures,
            outbox_depth=depth,
            set_aside=aside,
            last_error=self.last_error,
            identity_unknown_since=self.identity_unknown_since
            if self.identity == UNKNOWN
            else None,
        )

    def heartbeat_if_due(self) -> None:
        if self.heartbeat_interval <= 0 or self.clock.monotonic() < self._next_heartbeat:
            return
        if not self.identity_known:
            return  # the first one goes out as soon as the identity is known
        self._next_heartbeat = self.clock.monotonic() + self.heartbeat_interval
        health = self.health()
        envelope = heartbeat_message(
            self.observer,
            self.clock.now(),
            forwarder_version=__version__,
            last_incarnation=self.state.incarnation,
            outbox_depth=health.outbox_depth or 0,
            last_successful_poll=self.last_successful_poll,
            health={**health.heartbeat_health(), **self._listener_health()} or None,
        )
        with self._lock:
            self._heartbeat = envelope  # only the latest matters
        self.outbox_ready.set()

    def _listener_health(self) -> dict[str, Any]:
        """What listeners report as wrong (hooks that failed, say), for the Heartbeat."""
        out: dict[str, Any] = {}
        for listener in self.listeners:
            report = getattr(listener, "heartbeat_health", None)
            if report is None:
                continue
            try:
                out.update(report())
            except Exception:
                log.exception("listener %r health failed; ignored", listener)
        return out

    def life_of(self, key: str) -> lifecycle.Life | None:
        """What this forwarder remembers of an event (for the ids of what it reports on it)."""
        return self.state.lives.get(key)

    def enqueue(self, envelope: Envelope) -> None:
        """A message of the forwarder's own (Approved); kept in memory and retried every poll
        while the outbox cannot take it."""
        try:
            self.outbox.put([envelope])
        except OutboxError as exc:
            with self._lock:
                self._unsent = [*self._unsent, envelope][-MAX_UNSENT_APPROVED:]
            log.error("cannot write %s to the outbox (%s): retried", envelope.message_id, exc)
            return
        self.outbox_ready.set()

    def deliver(self, envelope: Envelope) -> bool:
        """A message of the forwarder's own that must not be lost nor re-sent under a new id
        (the VM's Prepared): True once it is durably in the outbox; False when the outbox
        cannot take it now (the caller keeps it and tries again later)."""
        with self._record_lock:
            if envelope.session_id in self._unrecorded:
                # Its event's transitions are not recorded yet (the outbox failed, or the poll
                # that derived them is writing them): it must not go in before them.
                log.debug("%s waits for its event's transitions", envelope.message_id)
                return False
            try:
                self.outbox.put([envelope])
            except OutboxError as exc:
                log.debug("cannot write %s to the outbox: %s", envelope.message_id, exc)
                return False
        self.outbox_ready.set()
        return True

    def _tell_document(self, document: Document, observed_at: datetime) -> None:
        """Hand the document to the listeners that follow documents (``document_observed``)."""
        self._tell("document_observed", document, self.local_observer, observed_at)

    def _tell_recorded(self) -> None:
        """Tell the listeners that want it (``poll_recorded``) that this poll's transitions are
        in the outbox: what :meth:`deliver` refused while the poll was deriving them
        (a Prepared, which must not go in before its event's transitions) may go in now. A
        retry from inside the poll (``document_observed``) is always refused, so a Prepared
        whose one-shot attempt met a poll in progress waited for ever (seen under load)."""
        self._tell("poll_recorded")

    def _tell(self, method: str, *args: object) -> None:
        """Call ``method``, an optional part of :class:`LoopListener`, on every listener that
        has it; a failure is logged and ignored."""
        for listener in self.listeners:
            call = getattr(listener, method, None)
            if call is None:
                continue
            try:
                call(*args)
            except Exception:
                log.exception("listener %r failed in %s; ignored", listener, method)

    def _flush_unsent(self) -> None:
        with self._lock:
            pending, self._unsent = self._unsent, []
        if not pending:
            return
        try:
            self.outbox.put(pending)
        except OutboxError:
            with self._lock:
                self._unsent = [*pending, *self._unsent][-MAX_UNSENT_APPROVED:]
            return
        self.outbox_ready.set()

    def _notify(self, call: Callable[[LoopListener], None]) -> None:
        for listener in self.listeners:
            try:
                call(listener)
            except Exception:
                log.exception("listener %r failed; ignored", listener)

    def command_settled(self, message_id: str | None, action: str, reason: str = "") -> None:
        """An approval command was settled (``action``: complete, dead-letter or abandon):
        told to the listeners that want it (``command_settled``), on the receiver's thread."""
        self._tell("command_settled", message_id, action, reason)

    def tick(self) -> float | None:
        """poll_once plus housekeeping; never raises. None = on schedule, else a backoff."""
        try:
            if (
                not self._identity_worker
                and self.identity != RESOLVED
                and self.clock.monotonic() >= self._next_observer_try
            ):
                self.resolve_observer()
            delay = self.poll_once()
            self.heartbeat_if_due()
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("poll tick failed; going on")
            delay = self._poll_backoff.next_delay()
        if self.listeners:
            health = self.health()
            self._notify(lambda listener: listener.polled(health))
        return delay

    def poll_loop(self) -> None:
        next_at = self.clock.monotonic()
        while not self.stop_event.is_set():
            backoff = self.tick()
            if backoff is None:
                # Fixed rate: one slow poll does not push every later poll back.
                next_at = max(next_at + self.poll_interval, self.clock.monotonic())
            else:
                next_at = self.clock.monotonic() + backoff
            self.stop_event.wait(max(0.0, next_at - self.clock.monotonic()))
        # Keep when the last poll was, so that a restart measures its gap from there.
        if self._save():
            self._release_saved()

    # -- sending ----------------------------------------------------------------------------
    def send_pending(self) -> int:
        """Send everything pending, in order, then the latest Heartbeat; returns how many
        transitions were sent. Raises PublishError (retry later) or OutboxError. Nothing goes
        out while the VM's identity is unknown."""
        sent = 0
        while not self.stop_event.is_set() and self.identity_known:
            rows = self.outbox.peek(PEEK_ROWS)
            if not rows:
                break
            try:
                count = self.publisher.publish([self._bound(envelope) for _, envelope in rows])
            except MessageRefused as exc:
                seq, envelope = rows[0]
                self.outbox.set_aside(seq, exc.reason)
                log.error(
                    "SET ASIDE %s (%s): it cannot be sent even alone: %s. It is kept in the "
                    "outbox's aside table; the messages behind it are sent on",
                    envelope.message_id,
                    envelope.subject,
                    exc.reason,
                )
                continue
            if not 1 <= count <= len(rows):
                raise PublishError(f"the publisher reported {count} of {len(rows)} sent")
            self.outbox.remove([seq for seq, _ in rows[:count]])
            sent += count
            log.debug("sent %d message(s): %s", count, [e.message_id for _, e in rows[:count]])
        self._send_heartbeat()
        return sent

    def _send_heartbeat(self) -> None:
        with self._lock:
            heartbeat, self._heartbeat = self._heartbeat, None
        if heartbeat is None or self.stop_event.is_set():
            return
        heartbeat = self._bound(heartbeat)  # built under the host name (IMDS served none)
        try:
            self.publisher.publish([heartbeat])
        except MessageRefused as exc:
            log.error("Heartbeat %s dropped: %s", heartbeat.message_id, exc.reason)
        except PublishError:
            with self._lock:
                if self._heartbeat is None:
                    self._heartbeat = heartbeat
            raise

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
            except (PublishError, OutboxError) as exc:
                delay = self._send_backoff.next_delay()
                self.last_error = f"publish: {exc}"
                log.warning(
                    "publish failed (%d in a row): %s; retrying in %.1f s",
                    self._send_backoff.failures,
                    exc,
                    delay,
                )
                self.stop_event.wait(delay)
            except Exception:
                log.exception("sender failed; going on")
                self.stop_event.wait(self._send_backoff.next_delay())

    # -- lifecycle --------------------------------------------------------------------------
    def _guarded(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            finally:
                if not self.stop_event.is_set():
                    log.error("%s ended unexpectedly: stopping", threading.current_thread().name)
                    self.crashed = True
                    self.stop()

        return run

    @contextlib.contextmanager
    def parked(self) -> Iterator[None]:
        """Around a worker's long blocking call that touches none of the forwarder's state
        (the approvals receiver waiting for a command): a stop that finds the thread still in
        it leaves it behind and closes the outbox and the local actions all the same (at stop
        they keep when the last poll was: a restart measures its gap from it). Leaving the call
        after that raises :class:`StoppedWhileParked` (instead of what the call returned or
        raised): the worker must then return at once."""
        me = threading.current_thread()
        with self._parking:
            if self._closing:
                raise StoppedWhileParked
            self._parked.add(me)
        try:
            yield
        finally:
            with self._parking:
                self._parked.discard(me)
                closing = self._closing
            if closing:
                raise StoppedWhileParked  # whatever the call returned or raised: nothing more

    def run(
        self,
        extra_workers: tuple[Callable[[], None], ...] = (),
        *,
        join_timeout: float = JOIN_TIMEOUT,
    ) -> bool:
        """Poll, send and run ``extra_workers``, each on its own thread, until :meth:`stop`;
        then give them ``join_timeout`` seconds in all to end. True when every one did; those
        left behind outside :meth:`parked` are in :attr:`left_in_use`."""
        # The identity is looked up on a thread of its own, so a lookup that hangs never delays a
        # poll. Correctness never depends on the lookup's speed: whatever the local actions
        # judged by the host name meanwhile is judged again once it answers (LocalActions.
        # _reevaluate). The first poll still waits for the first answer a little
        # (FIRST_LOOKUP_SECONDS): on a usual start (an answer within milliseconds) the first
        # judgment is then the right one, so no neighbour's hook starts for this VM's event
        # under the host name (SEBRIDGE_VM_NAME) to run beside its own hooks later.
        self._identity_worker = True
        identity = threading.Thread(
            target=self._guarded(self.identity_loop), name="identity", daemon=True
        )
        identity.start()
        self._first_lookup.wait(FIRST_LOOKUP_SECONDS)
        threads = [
            identity,
            threading.Thread(target=self._guarded(self.poll_loop), name="poller", daemon=True),
            threading.Thread(target=self._guarded(self.send_loop), name="sender", daemon=True),
        ]
        threads += [
            threading.Thread(
                target=self._guarded(worker),
                name=getattr(worker, "__name__", "worker"),
                daemon=True,
            )
            for worker in extra_workers
        ]
        for thread in threads[1:]:
            thread.start()
        self.stop_event.wait()
        self.stop()  # the stop event may have been set alone (a signal): wake the sender too
        deadline = self.clock.monotonic() + join_timeout
        for thread in threads:
            thread.join(max(0.0, deadline - self.clock.monotonic()))
        with self._parking:
            self._closing = True  # a parked thread now leaves its call only to return
            stuck = [thread for thread in threads if thread.is_alive()]
            in_use = [thread for thread in stuck if thread not in self._parked]
        self.left_in_use = [thread.name for thread in in_use]
        if stuck:
            names = [t.name + ("" if t in in_use else " (parked)") for t in stuck]
            log.info("not waiting longer than %.1f s for: %s", join_timeout, ", ".join(names))
        return not stuck

    def run_once(self, send_timeout: float = 30.0) -> bool:
        """``--once``: one poll, then send what is pending. True when both succeeded."""
        self.resolve_observer()
        polled = self.tick() is None and self.save_failing_since is None
        deadline = self.clock.monotonic() + send_timeout
        while self.clock.monotonic() < deadline and not self.stop_event.is_set():
            if not self.identity_known:  # what was polled waits for it, within the deadline
                left = min(self._next_observer_try, deadline) - self.clock.monotonic()
                if self.stop_event.wait(max(0.0, left)) or self.clock.monotonic() >= deadline:
                    break
                self.resolve_observer()
                continue
            try:
                if not self.outbox.peek(1):
                    break
                self.send_pending()
            except (PublishError, OutboxError) as exc:
                log.warning("publish failed: %s", exc)
                left = max(0.0, deadline - self.clock.monotonic())
                self.stop_event.wait(min(self._send_backoff.next_delay(), left))
        try:
            self._send_heartbeat()
        except PublishError as exc:
            log.warning("Heartbeat not sent: %s", exc)
        if self.outbox.depth():
            waiting = "" if self.identity_known else ", waiting for the VM's identity"
            log.error("%d message(s) still pending in the outbox%s", self.outbox.depth(), waiting)
        return polled and not self.outbox.depth()

    def stop(self) -> None:
        self.stop_event.set()
        self.outbox_ready.set()
