"""approval-gate: decide whether and when an event may start early, and approve it (core).

Scheduled and Updated are decided by the policy; ``approve-when-prepared`` approves once ARM
shows every affected VM out of all backend pools (checked read-only, at once and again when
lb-pools publishes Prepared); a VM that prepared itself (its forwarder's hooks or drain probe
publish an unsealed Prepared naming that VM alone: vm_side_prepared) counts as prepared without
ARM. Approving sends the command to the observer's forwarder through the ``approvals`` queue,
or, when the fallback is on and that forwarder's last Heartbeat is stale, acknowledges the
event through ARM instead. Heartbeats are remembered per VM.

Trust: a command goes only to the session of an observer that passed the scope check
(functions.shared.scope: it exists in ARM as claimed, and every affected VM shares its
availability set or scale set); the ARM fallback acknowledges on the VM id ARM returned, never
on an id from the message. A Heartbeat is recorded only for a verified observer.

Capacity: an event lb-pools drains (impactful) is never approved before its VMs are out of
their pools, whatever the policy says: ``approve`` is read as ``approve-when-prepared`` for it.
lb-pools may hold the drain (``LB_MIN_HEALTHY``); a held event's VMs stay in their pools, so the
ARM check fails and nothing is approved early until lb-pools drains it and publishes Prepared.

Maintenance windows (a rule's ``windows``, functions.approval_gate.windows): an event is approved
early only inside one. Outside, if a window opens before NotBefore, the gate schedules itself a
decision at its start (``decide-due`` on the drain-moments queue, kept like lb-pools' drain
moments: functions.lb_pools.moments) and decides again then; otherwise the event waits for its
NotBefore.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from functions.approval_gate import windows
from functions.approval_gate.agentless import AgentlessRules, Route, choose_route
from functions.approval_gate.policy import Action, Policy
from functions.lb_pools import moments, nic_pools
from functions.lb_pools.guard import CapacityGuard
from functions.lb_pools.held import body_of, maintenance_until
from functions.shared import scope as trust
from functions.shared import seal
from functions.shared.impact import ImpactRules
from functions.shared.ports import (
    AcknowledgeRefused,
    ArmClient,
    CommandSender,
    HeartbeatStore,
    MomentScheduler,
    PermissionDenied,
)
from functions.shared.verified import UnverifiedMessage, VerifiedMessage, verify_and_log
from functions.shared.vms import ResolvedVm, VmKind
from sebridge.contract.commands import CommandError, approve_command, canonical_event_id
from sebridge.contract.events import Transition, TransitionMessage

log = logging.getLogger("sebridge.functions.approval_gate")

REQUESTED_BY = "approval-gate"
DECIDE_ON = (Transition.SCHEDULED, Transition.UPDATED, Transition.PREPARED)
# How far ahead of the gate's clock a Heartbeat's time may be (docs/configuration.md).
CLOCK_SKEW = timedelta(minutes=5)


class GateOutcome(StrEnum):
    COMMAND_SENT = "command-sent"
    ACKNOWLEDGED = "acknowledged"  # through ARM (agentless, or the fallback)
    NOT_ACKNOWLEDGED = "not-acknowledged"  # ARM refused it for good (logged)
    WAITING = "waiting-for-prepared"
    MANUAL = "manual"
    NEVER = "never"
    TOO_LATE = "too-late"
    HEARTBEAT = "heartbeat-recorded"
    IGNORED = "ignored"
    REFUSED = "refused"  # the message failed the scope check
    HELD = "held-by-capacity"  # approving now would take a pool below its minimum, or it is held
    OUTSIDE_WINDOW = "outside-window"  # the rule's maintenance windows are closed now


@dataclass(frozen=True)
class Fallback:
    store: HeartbeatStore
    stale_after: timedelta


@dataclass(frozen=True)
class Gate:
    policy: Policy
    impact: ImpactRules
    arm: ArmClient
    commands: CommandSender
    fallback: Fallback | None = None  # None: ACKNOWLEDGE_FALLBACK_ENABLED is false
    rules: trust.TrustRules = field(default_factory=trust.TrustRules)
    agentless: AgentlessRules | None = None  # AGENTLESS_* settings (agentless.py)
    # The capacity decision every early approval asks (functions.lb_pools.guard); None: one
    # without a pool store, which allows everything, as LB_MIN_HEALTHY=0 does.
    guard: CapacityGuard | None = None
    # Where a decision at a window's start is scheduled (the drain-moments queue); None: not.
    scheduler: MomentScheduler | None = None
    # Outside the windows, unapproved: lb-pools puts back VMs it drained for a window that
    # closed, until their next moment (LbPools.replan). None: nothing to put back.
    replan: Callable[[str, datetime], object] | None = None

    def handle(self, message: TransitionMessage, now: datetime) -> GateOutcome:
        """Verify ``message`` (the trigger layer does this before :meth:`decide`), then
        decide."""
        pools = self.guard.pools if self.guard is not None else None
        checked = verify_and_log("approval_gate", self.arm, message, self.rules, records=pools)
        if isinstance(checked, UnverifiedMessage):
            return GateOutcome.REFUSED
        return self.decide(checked, now)

    def decide(self, verified: VerifiedMessage, now: datetime) -> GateOutcome:
        message = verified.message
        if message.transition is Transition.HEARTBEAT:
            if self.fallback is None:
                return GateOutcome.IGNORED
            # The time is the sender's word: never later than our clock allows for skew, so
            # a Heartbeat dated ahead keeps its forwarder "live" no longer than a true one.
            sent = message.time or now
            self.fallback.store.record(message.observer.vm_name, min(sent, now + CLOCK_SKEW))
            return GateOutcome.HEARTBEAT
        event = message.event
        if event is None or message.transition not in DECIDE_ON or event.is_started:
            return GateOutcome.IGNORED
        if verified.scope.observer.gone:
            log.info(
                "its observer no longer exists: nothing to approve", extra={"eventId": event.key}
            )
            return GateOutcome.IGNORED
        guard = self.guard or CapacityGuard(self.arm)
        # What the event names now, noted for every later decision on it (a Prepared or an
        # Approve link that carries fewer VMs than an Updated added: functions.shared.event_record).
        guard.remember(verified, now)
        try:
            canonical_event_id(event.key)
        except CommandError as exc:
            # IMDS EventIds are GUIDs; no approve command can name anything else.
            log.error(
                "message %s cannot be approved: %s",
                message.message_id,
                exc,
                extra={"messageId": message.message_id, "reason": "InvalidEventId"},
            )
            return GateOutcome.IGNORED
        decision = self.policy.decide(event, message.observer)
        fields = {"eventId": event.key, "rule": decision.rule, "action": decision.action.value}
        log.info("policy decision", extra=fields)
        if decision.action is Action.NEVER:
            return GateOutcome.NEVER
        if decision.action is Action.MANUAL:
            return GateOutcome.MANUAL
        opening: windows.Opening | None = None
        if decision.windows:
            opening = windows.before(decision.windows, now, event.not_before)
            if opening is None or not opening.contains(now):
                self._await_window(verified, opening, now)
                return GateOutcome.OUTSIDE_WINDOW
        drained = self.impact.is_impactful(event)
        vms = guard.affected_now(verified)
        if (decision.action is Action.APPROVE_WHEN_PREPARED or drained) and not self._prepared(
            verified, vm_side_prepared(message), vms
        ):
            log.info("waiting until the VMs are out of their pools", extra=fields)
            self._at_close(verified, opening)
            return GateOutcome.WAITING
        reason = f"policy rule {decision.rule}: {decision.action}"
        until = opening.end if opening is not None else None
        outcome = self.approve(verified, now, reason=reason, vms=vms, until=until)
        if outcome is GateOutcome.HELD:
            self._at_close(verified, opening)
        return outcome

    # ---- maintenance windows ---------------------------------------------------------------
    def _book(self) -> moments.MomentBook | None:
        pools = self.guard.pools if self.guard is not None else None
        if self.scheduler is None or pools is None:
            return None
        return moments.MomentBook(pools, self.scheduler, moments.DECIDE_KEY, moments.DECIDE_COMMAND)

    def _at_close(self, verified: VerifiedMessage, opening: windows.Opening | None) -> None:
        """Inside a window, not approved (waiting for the drain, or held): decide again when it
        closes, so VMs drained for it never stay out past it without an approval."""
        book = self._book()
        event = verified.message.event
        if opening is None or book is None or event is None:
            return
        book.set(
            verified.scoped_key,
            opening.end,
            verified.message.message_id or event.key,
            body_of(verified.message),
        )

    def _await_window(
        self, verified: VerifiedMessage, opening: windows.Opening | None, now: datetime
    ) -> None:
        """Outside every window of the rule: decide again when the next opens, if it opens
        before NotBefore (``opening``); else the event waits for its NotBefore. Either way,
        VMs lb-pools drained for a window that closed go back into their pools until the
        lead before the next opening (or before NotBefore): :meth:`LbPools.replan`."""
        message = verified.message
        event = message.event
        assert event is not None
        book = self._book()
        if opening is None:
            log.info(
                "outside the rule's maintenance windows, and none opens before NotBefore: "
                "not approved early",
                extra={"eventId": event.key},
            )
            if book is not None:
                book.drop(verified.scoped_key)
        elif book is None:
            log.warning(
                "a maintenance window opens at %s, but without DrainMomentsQueueName the gate "
                "cannot decide again then: the event waits for a later message or NotBefore",
                opening.start.isoformat(),
                extra={"eventId": event.key},
            )
        else:
            book.set(
                verified.scoped_key,
                opening.start,
                message.message_id or event.key,
                body_of(message),
            )
            log.info(
                "outside the rule's maintenance windows: decided again when one opens at %s",
                opening.start.isoformat(),
                extra={"eventId": event.key, "windowOpens": opening.start.isoformat()},
            )
        if self.replan is not None:
            self.replan(verified.scoped_key, now)

    def fire(self, due: moments.Due, now: datetime) -> GateOutcome:
        """A maintenance window opened: decide the event again in the scope ``due`` names (its
        newest message there, verified again in that scope), if its token is still that
        scope's moment and has not fired."""
        book = self._book()
        if book is None:
            return GateOutcome.IGNORED
        pools = self.guard.pools if self.guard is not None else None
        taken = book.take(
            due,
            lambda message: verify_and_log(
                "approval_gate", self.arm, message, self.rules, records=pools
            ),
        )
        if isinstance(taken, str):
            return GateOutcome.IGNORED
        log.info("a maintenance window opened", extra={"eventId": due.event_id})
        outcome = self.decide(taken, now)
        book.done(due)
        return outcome

    def _prepared(
        self,
        verified: VerifiedMessage,
        self_prepared: str | None,
        vms: Sequence[ResolvedVm] | None = None,
    ) -> bool:
        """Is every affected VM (``vms``: what the event names now, else the message's) prepared?
        ``self_prepared`` is the VM that prepared itself (its forwarder's hooks or drain probe,
        :func:`vm_side_prepared`); every other VM must be out of every backend pool in ARM
        (read-only). A VM the app may not read (403) is not: what cannot be checked is not
        approved early."""
        affected = verified.scope.vms if vms is None else vms
        event = verified.message.event
        assert event is not None
        if self_prepared is not None and [vm.name.lower() for vm in affected] == [self_prepared]:
            # The only affected VM prepared itself: nothing to ask ARM (its pools may be ones
            # lb-pools cannot drain, a Uniform scale set's or an Application Gateway's).
            return True
        if not self.impact.is_impactful(event):
            return True  # lb-pools leaves such VMs in their pools: there is nothing to wait for
        try:
            for vm in affected:
                if vm.kind is VmKind.GONE or vm.name.lower() == self_prepared:
                    continue
                if vm.kind is VmKind.FORBIDDEN:
                    return self._not_checkable(event.key, vm.problem)
                for nic_id in vm.nic_ids:
                    # Out for this event (its drain's claim), not for another event whose
                    # end would put the VM back under this one's maintenance.
                    nic = self.arm.get_nic(nic_id)
                    if nic is not None and not nic_pools.out_for(nic.body, verified.scoped_key):
                        return False
        except PermissionDenied as exc:
            return self._not_checkable(event.key, str(exc))
        return True

    @staticmethod
    def _not_checkable(event_id: str, problem: str) -> bool:
        log.error(
            "cannot check the pools, so no early approval: %s",
            problem,
            extra={"eventId": event_id, "reason": "PermissionDenied"},
        )
        return False

    def acknowledge_target(self, verified: VerifiedMessage, now: datetime) -> str | None:
        """Where an approval of this event goes: None for the approve command to the
        observer's forwarder, else the ARM id to acknowledge it on (agentless.choose_route):
        always the id ARM returned for the verified observer, never an id from the message."""
        message = verified.message
        choice = choose_route(
            message,
            now,
            rules=self.agentless,
            heartbeats=self.fallback.store if self.fallback else None,
            stale_after=self.fallback.stale_after if self.fallback else None,
        )
        if choice.route is not Route.ACKNOWLEDGE:
            return None
        log.log(
            logging.WARNING if choice.alarming else logging.INFO,
            "approving through ARM: %s",
            choice.reason,
            extra={"eventId": message.event_id, "vm": message.observer.vm_name},
        )
        return verified.scope.observer.id

    def approve(
        self,
        verified: VerifiedMessage,
        now: datetime,
        *,
        reason: str,
        vms: Sequence[ResolvedVm] | None = None,
        until: datetime | None = None,
    ) -> GateOutcome:
        """Approve the event early: the command to the observer's forwarder, or the ARM
        acknowledge (agentless, or the fallback), once the capacity decision allows it for
        ``vms`` (what the event names now; default: what the event's record says, else the
        message). ``until``: the end of the maintenance window it is approved in: the command
        expires then (or at NotBefore, if sooner), so no forwarder starts the event after the
        window closed."""
        message = verified.message
        event = message.event
        assert event is not None
        # Azure starts the event at NotBefore anyway; a command must expire by then.
        expires_at = event.not_before or now + timedelta(minutes=5)
        if until is not None:
            expires_at = min(expires_at, until)
        if expires_at <= now:
            log.info("NotBefore has passed, nothing to approve", extra={"eventId": event.key})
            return GateOutcome.TOO_LATE
        observer = message.observer
        target = self.acknowledge_target(verified, now)
        sent: list[GateOutcome] = []

        def act() -> None:
            if target is not None:
                sent.append(self._acknowledge(target, event.key, observer.vm_name))
                return
            command = approve_command(event.key, REQUESTED_BY, reason, expires_at)
            self.commands.send(command, observer.vm_name)
            log.info("approve command sent", extra={"eventId": event.key, "vm": observer.vm_name})
            sent.append(GateOutcome.COMMAND_SENT)

        if not self.impact.is_impactful(event):
            # By the operator's own rules (LB_IMPACTFUL_EVENT_TYPES, the freeze threshold) it
            # takes no capacity: lb-pools leaves its VMs in their pools too.
            act()
            self._approved(verified.scoped_key)
            return sent[0]
        guard = self.guard or CapacityGuard(self.arm)
        affected = guard.affected_now(verified) if vms is None else vms
        until = maintenance_until(event, now)
        clearance = guard.clear(verified.scoped_key, affected, now, until, act)
        if not clearance.allowed:
            return GateOutcome.HELD
        self._approved(verified.scoped_key)
        return sent[0]

    def _approved(self, key: str) -> None:
        """Approved: no decision at a window's close is needed any more."""
        book = self._book()
        if book is not None:
            book.drop(key)

    def _acknowledge(self, target: str, event_id: str, vm_name: str) -> GateOutcome:
        try:
            self.arm.acknowledge_event(target, event_id)
        except (AcknowledgeRefused, PermissionDenied) as exc:
            # No retry changes it (a missing role, an event ARM no longer has, one already
            # acknowledged): logged, and Azure starts the event at NotBefore as planned.
            log.error(
                "ARM did not take the acknowledgement of %s: %s",
                event_id,
                exc,
                extra={"eventId": event_id, "vm": vm_name, "reason": str(exc)},
            )
            return GateOutcome.NOT_ACKNOWLEDGED
        return GateOutcome.ACKNOWLEDGED


def vm_side_prepared(message: TransitionMessage) -> str | None:
    """The VM that says it prepared itself, lower-case, or None.

    A Prepared the app did not seal comes from a forwarder (its hooks or its drain probe,
    issue 16). It counts for one VM only: the observer, which passed the scope check (it exists
    as claimed and the event lists it), and only when it names nobody else. A forwarder cannot
    speak for another VM: any other affected VM must still be out of its pools in ARM.
    """
    if message.transition is not Transition.PREPARED or seal.is_sealed(message):
        return None
    prepared = message.data.get("prepared")
    if not isinstance(prepared, dict):
        return None
    vms = prepared.get("vms")
    observer = message.observer.vm_name.lower()
    if not isinstance(vms, list) or [str(vm).lower() for vm in vms] != [observer]:
        return None
    return observer
