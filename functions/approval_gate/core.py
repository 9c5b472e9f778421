"""approval-gate: decide whether and when an event may start early, and approve it (core).

Scheduled and Updated are decided by the policy; ``approve-when-prepared`` approves once ARM
shows every affected VM out of all backend pools (checked read-only, at once and again when
lb-pools publishes Prepared). Approving sends the command to the observer's forwarder through
the ``approvals`` queue, or, when the fallback is on and that forwarder's last Heartbeat is
stale, acknowledges the event through ARM instead. Heartbeats are remembered per VM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from functions.approval_gate.agentless import AgentlessRules, Route, choose_route
from functions.approval_gate.policy import Action, Policy
from functions.lb_pools import nic_pools
from functions.shared.impact import ImpactRules
from functions.shared.ports import ArmClient, CommandSender, HeartbeatStore, PermissionDenied
from functions.shared.vms import UnresolvableScope, VmKind, affected_vms, resolve
from sebridge.contract.commands import approve_command
from sebridge.contract.events import Transition, TransitionMessage

log = logging.getLogger("sebridge.functions.approval_gate")

REQUESTED_BY = "approval-gate"
DECIDE_ON = (Transition.SCHEDULED, Transition.UPDATED, Transition.PREPARED)


class GateOutcome(StrEnum):
    COMMAND_SENT = "command-sent"
    ACKNOWLEDGED = "acknowledged"  # through ARM (fallback)
    WAITING = "waiting-for-prepared"
    MANUAL = "manual"
    NEVER = "never"
    TOO_LATE = "too-late"
    HEARTBEAT = "heartbeat-recorded"
    IGNORED = "ignored"


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
    agentless: AgentlessRules | None = None  # AGENTLESS_* settings (agentless.py)

    def handle(self, message: TransitionMessage, now: datetime) -> GateOutcome:
        if message.transition is Transition.HEARTBEAT:
            if self.fallback is None:
                return GateOutcome.IGNORED
            self.fallback.store.record(message.observer.vm_name, message.time or now)
            return GateOutcome.HEARTBEAT
        event = message.event
        if event is None or message.transition not in DECIDE_ON or event.is_started:
            return GateOutcome.IGNORED
        decision = self.policy.decide(event, message.observer)
        fields = {"eventId": event.key, "rule": decision.rule, "action": decision.action.value}
        log.info("policy decision", extra=fields)
        if decision.action is Action.NEVER:
            return GateOutcome.NEVER
        if decision.action is Action.MANUAL:
            return GateOutcome.MANUAL
        if decision.action is Action.APPROVE_WHEN_PREPARED and not self._prepared(message):
            log.info("waiting until the VMs are out of their pools", extra=fields)
            return GateOutcome.WAITING
        return self.approve(message, now, reason=f"policy rule {decision.rule}: {decision.action}")

    def _prepared(self, message: TransitionMessage) -> bool:
        """ARM, read-only: is every affected VM out of every backend pool? A VM the app may
        not read (403) is not: what cannot be checked is not approved early."""
        event = message.event
        assert event is not None
        if not self.impact.is_impactful(event):
            return True  # lb-pools leaves such VMs in their pools: there is nothing to wait for
        try:
            for name in affected_vms(event.resources, message.observer):
                vm = resolve(self.arm, message.observer, name)
                if vm.kind is VmKind.GONE:
                    continue
                if vm.kind is VmKind.FORBIDDEN:
                    return self._not_checkable(event.key, vm.problem)
                for nic_id in vm.nic_ids:
                    nic = self.arm.get_nic(nic_id)
                    if nic is not None and nic_pools.in_any_pool(nic.body):
                        return False
        except UnresolvableScope as exc:
            log.error("cannot check the pools: %s", exc, extra={"eventId": event.key})
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

    def approve(self, message: TransitionMessage, now: datetime, *, reason: str) -> GateOutcome:
        event = message.event
        assert event is not None
        # Azure starts the event at NotBefore anyway; a command must expire by then.
        expires_at = event.not_before or now + timedelta(minutes=5)
        if expires_at <= now:
            log.info("NotBefore has passed, nothing to approve", extra={"eventId": event.key})
            return GateOutcome.TOO_LATE
        observer = message.observer
        choice = choose_route(
            message,
            now,
            rules=self.agentless,
            heartbeats=self.fallback.store if self.fallback else None,
            stale_after=self.fallback.stale_after if self.fallback else None,
        )
        if choice.route is Route.ACKNOWLEDGE:
            log.log(
                logging.WARNING if choice.alarming else logging.INFO,
                "acknowledging through ARM: %s",
                choice.reason,
                extra={"eventId": event.key, "vm": observer.vm_name},
            )
            self.arm.acknowledge_event(observer.resource_id, event.key)
            return GateOutcome.ACKNOWLEDGED
        command = approve_command(event.key, REQUESTED_BY, reason, expires_at)
        self.commands.send(command, observer.vm_name)
        log.info("approve command sent", extra={"eventId": event.key, "vm": observer.vm_name})
        return GateOutcome.COMMAND_SENT
