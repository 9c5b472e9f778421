"""``Prepared`` from the VM itself: published once every local preparation of an event is done.

Two things on the VM can prepare it for an event: the prepare hooks (checkpoint, drain the
application) and the drain probe (the load balancer has stopped sending new connections). Each
is a :class:`Preparer` that says, per event, ``pending``, ``succeeded``, ``failed`` or nothing
(it has nothing to do for that event). When every preparer with something to do has succeeded,
one ``Prepared`` is published for the event's latest Scheduled or Updated (its ``cause``),
naming this VM and who prepared it (``hooks``, ``drain-probe`` or ``hooks+drain-probe``). Had
each published its own, the approval gate could approve after the checkpoint while the load
balancer still sends traffic.

A failed preparer means no Prepared for that cause: the event starts at NotBefore as Azure
schedules it, nobody approves it early, and the failure is logged and counted (Heartbeat).

Ids: :func:`sebridge.contract.events.derived_message_id` of a cause that adds the method and
the VM to the transition's message id. The transition's id alone is what lb-pools derives its
Prepared from, and every VM of an availability set reports the same transition id: with it,
duplicate detection would keep only the first of lb-pools' and each VM's Prepared.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from sebridge.contract.events import (
    ContractError,
    Envelope,
    Observer,
    Transition,
    parse_message,
    prepared_message,
)
from sebridge.forwarder.local.hooks_file import affects
from sebridge.forwarder.local.journal import Journal, JournalError
from sebridge.imds import InvalidDocument, ScheduledEvent

log = logging.getLogger("forwarder.prepared")

PREPARE_CAUSES = (Transition.SCHEDULED, Transition.UPDATED)
ENDS = (Transition.COMPLETED, Transition.CANCELLED)
OBSERVED = (
    Transition.SCHEDULED,
    Transition.UPDATED,
    Transition.STARTED,
    Transition.COMPLETED,
    Transition.CANCELLED,
)


@dataclass(frozen=True)
class Observed:
    """One lifecycle transition the forwarder derived from IMDS, as the local actions see it."""

    transition: Transition
    event: ScheduledEvent
    message_id: str
    observer: Observer
    incarnation: int = 0

    @property
    def affects_this_vm(self) -> bool:
        return affects(self.event.resources, self.observer.vm_name)

    @classmethod
    def from_envelope(cls, envelope: Envelope) -> Observed | None:
        """The transition a contract message reports; None for anything else (Heartbeat,
        Approved, Prepared...)."""
        try:
            message = parse_message(envelope.body, envelope.message_id)
        except ContractError:
            return None
        if message.transition not in OBSERVED or message.event is None:
            return None
        return cls(
            message.transition,
            message.event,
            envelope.message_id,
            message.observer,
            message.incarnation or 0,
        )

    def payload(self) -> dict[str, Any]:
        return {
            "event": self.event.to_imds(),
            "observer": self.observer.to_data(),
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_payload(cls, transition: Transition, message_id: str, payload: Any) -> Observed:
        """Raises ValueError for a damaged record."""
        if not isinstance(payload, dict):
            raise ValueError("not an object")
        try:
            event = ScheduledEvent.from_imds(payload.get("event"))
            observer = Observer.from_data(payload.get("observer") or {})
        except (InvalidDocument, ContractError) as exc:
            raise ValueError(str(exc)) from exc
        incarnation = payload.get("incarnation")
        return cls(
            transition,
            event,
            message_id,
            observer,
            incarnation if isinstance(incarnation, int) else 0,
        )


class Preparer(Protocol):
    name: str

    def preparation_status(self, event_key: str) -> str | None:
        """``pending``, ``succeeded`` or ``failed``; None: nothing to do for the event."""


@dataclass
class Preparations:
    journal: Journal
    enqueue: Callable[[Envelope], None]  # into the forwarder's outbox
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    preparers: list[Preparer] = field(default_factory=list)
    published_count: int = 0
    failed_count: int = 0  # causes for which a preparer failed (no Prepared)
    _failed: set[tuple[str, str]] = field(default_factory=set)
    # Held while a transition is handed to every preparer (see :meth:`observing`) and while a
    # check decides: no preparer's quick success is seen before the others heard of the cause.
    _lock: threading.RLock = field(default_factory=threading.RLock)

    def observing(self) -> threading.RLock:
        """``with preparations.observing(): ...`` around handing one transition to every
        preparer, so that no check sees some of them told and others not."""
        return self._lock

    def observe(self, observed: Observed) -> None:
        """Called for every transition, before the preparers hear of it. An event that ends,
        or that an Updated no longer lets affect this VM, has nothing more to prepare.
        Raises JournalError."""
        key = observed.event.key
        if observed.transition in ENDS or not observed.affects_this_vm:
            if self.journal.preparation(key) is not None:
                self.journal.end(key)
        else:
            cause = observed.message_id if observed.transition in PREPARE_CAUSES else None
            self.journal.observe(key, cause, observed.payload())

    def check(self, event_key: str) -> Envelope | None:
        """Publish Prepared when the event's current cause is prepared; called by a preparer
        whenever its status for the event changed (from any thread). Never raises."""
        try:
            with self._lock:
                return self._check(event_key)
        except JournalError as exc:
            log.error("cannot read the journal to decide Prepared for %s: %s", event_key, exc)
        except Exception:
            log.exception("deciding Prepared for %s failed", event_key)
        return None

    def check_all(self) -> int:
        """At start: publish what was prepared before a crash but not yet published."""
        try:
            keys = [p.event_key for p in self.journal.open_preparations()]
        except JournalError as exc:
            log.error("cannot read the journal: %s", exc)
            return 0
        return sum(1 for key in keys if self.check(key) is not None)

    def _check(self, event_key: str) -> Envelope | None:
        record = self.journal.preparation(event_key)
        if record is None or record.ended or record.cause is None:
            return None
        if record.published == record.cause:
            return None
        try:
            observed = Observed.from_payload(Transition.SCHEDULED, record.cause, record.payload)
        except ValueError as exc:
            log.error("damaged preparation record for %s: %s", event_key, exc)
            return None
        if observed.event.is_started:
            return None  # too late: the gate has nothing left to decide
        statuses = [(p.name, p.preparation_status(event_key)) for p in self.preparers]
        relevant = [(name, status) for name, status in statuses if status is not None]
        if not relevant:
            return None
        failed = [name for name, status in relevant if status == "failed"]
        if failed:
            if (event_key, record.cause) not in self._failed:
                self._failed.add((event_key, record.cause))
                self.failed_count += 1
                log.error(
                    "NOT PREPARED for event %s: %s failed; no Prepared is published, so the "
                    "event is not approved early",
                    event_key,
                    "+".join(failed),
                    extra={"eventId": event_key, "cause": record.cause},
                )
            return None
        if any(status != "succeeded" for _, status in relevant):
            return None
        prepared_by = "+".join(name for name, _ in relevant)
        vm = observed.observer.vm_name
        envelope = prepared_message(
            observed.event,
            observed.observer,
            observed.incarnation,
            self.now(),
            source=observed.observer.source,
            prepared_vms=[vm],
            cause=f"{record.cause}|{prepared_by}|{vm.lower()}",
            prepared_by=prepared_by,
        )
        self.enqueue(envelope)
        self.journal.published(event_key, record.cause)
        self.published_count += 1
        log.info(
            "Prepared %s by %s (after %s)",
            observed.event.event_id,
            prepared_by,
            record.cause,
            extra={"transition": "Prepared", "messageId": envelope.message_id},
        )
        return envelope
