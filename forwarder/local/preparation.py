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

Prepared is marked published (in the store, then the journal) only once the outbox has durably
taken it (``deliver`` returned True): an outbox that cannot be written (a full disk) is tried
again at every poll until it can, and a crash between the outbox write and the mark publishes
it again after the restart with the same message id (the topic's duplicate detection keeps
one). Nothing is lost, nothing is sent under a new id.

Ids: :func:`sebridge.contract.events.derived_message_id` of a cause that adds the method and
the VM to the transition's message id. The transition's id alone is what lb-pools derives its
Prepared from, and every VM of an availability set reports the same transition id: with it,
duplicate detection would keep only the first of lb-pools' and each VM's Prepared.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from sebridge.contract.events import (
    ContractError,
    Envelope,
    Observer,
    Transition,
    prepared_message,
)
from sebridge.forwarder.local.hooks_file import affects
from sebridge.forwarder.local.journal import Preparation
from sebridge.forwarder.local.store import LocalStore
from sebridge.imds import InvalidDocument, ScheduledEvent

log = logging.getLogger("forwarder.prepared")

PREPARE_CAUSES = (Transition.SCHEDULED, Transition.UPDATED)
ENDS = (Transition.COMPLETED, Transition.CANCELLED)


@dataclass(frozen=True)
class Observed:
    """One lifecycle transition the local actions derived from an IMDS document."""

    transition: Transition
    event: ScheduledEvent
    message_id: str
    observer: Observer
    incarnation: int | None = None

    @property
    def affects_this_vm(self) -> bool:
        return affects(self.event.resources, self.observer.vm_name)

    def payload(self) -> dict[str, Any]:
        return {
            "event": self.event.to_imds(),
            "observer": self.observer.to_data(),
            "incarnation": self.incarnation,
        }

    @classmethod
    def from_payload(cls, transition: Transition, message_id: str, payload: Any) -> Observed:
        """Read back as tolerantly as the document it came from; ValueError for a damaged
        record (no EventId, no observer name)."""
        if not isinstance(payload, dict):
            raise ValueError("not an object")
        try:
            event = ScheduledEvent.from_imds(payload.get("event"), strict=False)
            observer_data = payload.get("observer")
            observer = Observer.from_data(observer_data if isinstance(observer_data, dict) else {})
        except (InvalidDocument, ContractError) as exc:
            raise ValueError(str(exc)) from exc
        incarnation = payload.get("incarnation")
        return cls(
            transition,
            event,
            message_id,
            observer,
            incarnation
            if isinstance(incarnation, int) and not isinstance(incarnation, bool)
            else None,
        )


class Preparer(Protocol):
    name: str

    def preparation_status(self, event_key: str) -> str | None:
        """``pending``, ``succeeded`` or ``failed``; None: nothing to do for the event."""


@dataclass
class Preparations:
    store: LocalStore
    # Hand Prepared to the forwarder's outbox: True once it is durably there, False when the
    # outbox cannot take it now (tried again at the next check).
    deliver: Callable[[Envelope], bool]
    now: Callable[[], datetime] = lambda: datetime.now(UTC)
    preparers: list[Preparer] = field(default_factory=list)
    published_count: int = 0
    failed_count: int = 0  # causes for which a preparer failed (no Prepared)
    _failed: set[tuple[str, str]] = field(default_factory=set)
    _waiting: set[str] = field(default_factory=set)  # Prepared messages the outbox refused
    _told: set[str] = field(default_factory=set)  # ...and refused again: said at ERROR

    def observe(self, observed: Observed) -> None:
        """Called for every transition, before the preparers hear of it (in memory; the caller
        flushes). An event that ends, or that an Updated no longer lets affect this VM, has
        nothing more to prepare."""
        key = observed.event.key
        with self.store.lock:
            record = self.store.preparation(key)
            if observed.transition in ENDS or not observed.affects_this_vm:
                if record is not None and not record.ended:
                    self.store.set_preparation(replace(record, ended=True))
                return
            cause = observed.message_id if observed.transition in PREPARE_CAUSES else None
            self.store.set_preparation(
                Preparation(
                    key,
                    cause if cause is not None else (record.cause if record else None),
                    observed.payload(),
                    record.published if record else None,
                    False,
                )
            )

    def check(self, event_key: str) -> Envelope | None:
        """Publish Prepared when the event's current cause is prepared; called by a preparer
        whenever its status for the event changed (from any thread), and at every poll for
        what is not yet published. Never raises."""
        try:
            with self.store.lock:
                return self._check(event_key)
        except Exception:
            log.exception("deciding Prepared for %s failed", event_key)
        return None

    def check_all(self) -> int:
        """Every open preparation not yet published (at start, and at every poll: what was
        prepared before a crash, or while the outbox could not be written)."""
        with self.store.lock:
            keys = [
                p.event_key
                for p in self.store.open_preparations()
                if p.cause is not None and p.published != p.cause
            ]
        return sum(1 for key in keys if self.check(key) is not None)

    def _check(self, event_key: str) -> Envelope | None:
        record = self.store.preparation(event_key)
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
        if not self.deliver(envelope):
            # The first refusal is the usual one: the poll that made it due has not recorded
            # its own transitions yet (they go first), and the try after it succeeds. Refused
            # again, the outbox cannot take it: said once at ERROR.
            if envelope.message_id not in self._waiting:
                self._waiting.add(envelope.message_id)
                log.info(
                    "Prepared %s for %s waits for the outbox (this poll's transitions go first)",
                    envelope.message_id,
                    observed.event.event_id,
                )
            elif envelope.message_id not in self._told:
                self._told.add(envelope.message_id)
                log.error(
                    "Prepared %s for %s cannot be written to the outbox yet: tried again at "
                    "every poll",
                    envelope.message_id,
                    observed.event.event_id,
                )
            return None
        self._waiting.discard(envelope.message_id)
        self._told.discard(envelope.message_id)
        self.store.set_preparation(replace(record, published=record.cause))
        self.store.flush()  # if it fails, the mark goes with the next flush (the same id again)
        self.published_count += 1
        log.info(
            "Prepared %s by %s (after %s)",
            observed.event.event_id,
            prepared_by,
            record.cause,
            extra={"transition": "Prepared", "messageId": envelope.message_id},
        )
        return envelope
