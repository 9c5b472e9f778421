"""A message past the trust boundary, and one that is not: two types, one way to tell them apart
(core, ARM port).

Every Service Bus-triggered function receives a message only through
:func:`functions.shared.triggers.service_bus_function`, which decodes it and runs
:func:`verify` (the seal check and the scope check, functions.shared.scope) before it calls the
function. A function gets a :class:`VerifiedMessage`; one that asks for everything (the Teams
cards, the webhooks' audit endpoints) also gets an :class:`UnverifiedMessage` for a message that
failed, with the reason, and marks what it makes of it as unverified.

What resolves, closes or approves anything (NIC writes, approve commands, the ARM acknowledge,
PagerDuty's resolve, an Approve link) takes a VerifiedMessage, so mypy rejects the mistake of
handing it anything else. Only :func:`verify` makes one.
"""

from __future__ import annotations

from dataclasses import dataclass

from functions.shared import scope as trust
from functions.shared.event_record import event_of, placement_digest, scoped_event_key
from functions.shared.ports import ArmClient, EventRecords
from sebridge.contract.events import TransitionMessage


@dataclass(frozen=True)
class VerifiedMessage:
    """A message whose seal (when it claims one) verified and whose observer and affected VMs
    passed the scope check: ``scope`` is what ARM says about them."""

    message: TransitionMessage
    scope: trust.Scope

    @property
    def placement(self) -> str:
        """The verified observer's placement, lower case: its availability set, else its scale
        set, else its own id. Every observer IMDS (or Event Grid) shows one event to has the same
        one, so it names the event's scope: what one scope says never reaches another's."""
        observer = self.scope.observer
        return (observer.availability_set or observer.scale_set or observer.id).lower()

    @property
    def placement_digest(self) -> str:
        """A short, stable digest of :attr:`placement` (for keys with a length limit)."""
        return placement_digest(self.placement)

    @property
    def scoped_key(self) -> str:
        """The event in this message's verified scope: what every workflow keeps per event is
        kept under it (:func:`scoped_event_key`), so that what one scope says of an EventId
        never ends, holds, forgets or blocks another scope's event."""
        event = self.message.event
        return scoped_event_key(event.key if event else self.message.event_id or "", self.placement)


@dataclass(frozen=True)
class UnverifiedMessage:
    """A message that failed the seal or the scope check: shown, marked, never acted on."""

    message: TransitionMessage
    refusal: trust.Refusal

    @property
    def reason(self) -> str:
        return self.refusal.reason


Checked = VerifiedMessage | UnverifiedMessage

__all__ = [
    "Checked",
    "UnverifiedMessage",
    "VerifiedMessage",
    "event_of",
    "placement_digest",
    "scoped_event_key",
    "verify",
    "verify_and_log",
]


def verify(
    arm: ArmClient,
    message: TransitionMessage,
    rules: trust.TrustRules,
    *,
    records: EventRecords | None = None,
) -> Checked:
    """The seal check and the scope check (functions.shared.scope.check) of ``message``;
    ``records`` (the events' records) place a sealed message's VM observer that is gone."""
    checked = trust.check(arm, message, rules, records=records)
    if isinstance(checked, trust.Refusal):
        return UnverifiedMessage(message, checked)
    return VerifiedMessage(message, checked)


def verify_and_log(
    workflow: str,
    arm: ArmClient,
    message: TransitionMessage,
    rules: trust.TrustRules,
    *,
    records: EventRecords | None = None,
) -> Checked:
    """:func:`verify`, logging a refusal as a security event (or, for an observer the app may
    not read, a missing permission) named after ``workflow``."""
    checked = verify(arm, message, rules, records=records)
    if isinstance(checked, UnverifiedMessage):
        trust.log_refusal(workflow, message, checked.refusal)
    return checked
