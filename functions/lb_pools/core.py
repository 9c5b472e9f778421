"""lb-pools: take affected VMs out of load balancer backend pools and put them back (core).

Scheduled, Updated and Started of an impactful event drain every NIC of every affected VM;
once all of them are out of all pools (or gone), a Scheduled or Updated publishes ``Prepared``
for the approval gate. Completed and Cancelled restore what the NIC's tag recorded, except
after Terminate and Preempt (the VM is gone). Every step reads ARM first, so a replay finds
the work done and changes nothing. Faults propagate: Service Bus redelivers the message.
A missing permission (ARM 403) is not a fault a retry repairs: it is logged at ERROR naming the
permission and scope, the VM stays in its pools (no Prepared) and the message completes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from functions.lb_pools import nic_pools
from functions.shared.impact import ImpactRules, restores_afterwards
from functions.shared.ports import ArmClient, PermissionDenied, PreconditionFailed, TopicPublisher
from functions.shared.vms import ResolvedVm, UnresolvableScope, VmKind, affected_vms, resolve
from sebridge.contract.events import Transition, TransitionMessage, prepared_message

log = logging.getLogger("sebridge.functions.lb_pools")

SOURCE = "urn:sebridge:function:lb-pools"
DRAIN_ON = (Transition.SCHEDULED, Transition.UPDATED, Transition.STARTED)
PREPARED_AFTER = (Transition.SCHEDULED, Transition.UPDATED)
RESTORE_ON = (Transition.COMPLETED, Transition.CANCELLED)
MAX_ETAG_RETRIES = 3


@dataclass
class LbOutcome:
    action: str  # "drain", "restore" or "ignore"
    changed: list[str] = field(default_factory=list)  # NIC ids that were PUT
    not_ready: list[str] = field(default_factory=list)  # VMs still in a pool
    published_prepared: bool = False
    reason: str = ""


def _change_nic(
    arm: ArmClient,
    nic_id: str,
    plan: Callable[[dict[str, object], str], nic_pools.NicChange | None],
) -> tuple[bool, bool]:
    """(changed, gone): read, plan, PUT with If-Match; re-read when someone else wrote first."""
    for _ in range(MAX_ETAG_RETRIES):
        nic = arm.get_nic(nic_id)
        if nic is None:
            return False, True
        change = plan(nic.body, nic_id)
        if change is None:
            return False, False
        try:
            arm.put_nic(nic_id, change.body, nic.etag)
        except PreconditionFailed:
            log.info("NIC changed while we wrote it, re-reading", extra={"nic": nic_id})
            continue
        log.info("NIC pools changed", extra={"nic": nic_id, "pools": change.pools})
        return True, False
    raise PreconditionFailed(f"{nic_id}: still changing after {MAX_ETAG_RETRIES} attempts")


def _drain_vm(arm: ArmClient, vm: ResolvedVm, outcome: LbOutcome) -> None:
    if vm.kind is VmKind.GONE:
        log.warning("VM not found in ARM, nothing to drain", extra={"vm": vm.name})
        return
    if vm.kind is VmKind.FORBIDDEN:
        log.error(
            "VM %s left in its pools, no Prepared: %s",
            vm.name,
            vm.problem,
            extra={"vm": vm.name, "reason": "PermissionDenied"},
        )
        outcome.not_ready.append(vm.name)
        return
    if vm.kind is VmKind.UNIFORM:
        # Pool membership of a Uniform instance is the scale-set model's: not ours to change.
        log.warning("Uniform scale-set instance: pools left as they are", extra={"vm": vm.name})
        outcome.not_ready.append(vm.name)
        return
    for nic_id in vm.nic_ids:
        try:
            changed, gone = _change_nic(arm, nic_id, nic_pools.plan_drain)
        except nic_pools.RecordTooLarge as exc:
            log.error("NIC left in its pools: %s", exc, extra={"vm": vm.name, "nic": nic_id})
            outcome.not_ready.append(vm.name)
            continue
        except PermissionDenied as exc:
            # Denied once for this VM: touch none of its other NICs either.
            log.error(
                "VM %s left in its pools, no Prepared: %s",
                vm.name,
                exc,
                extra={"vm": vm.name, "nic": nic_id, "reason": "PermissionDenied"},
            )
            outcome.not_ready.append(vm.name)
            break
        if gone:
            log.warning("NIC not found in ARM", extra={"vm": vm.name, "nic": nic_id})
        if changed:
            outcome.changed.append(nic_id)


def _restore_vm(arm: ArmClient, vm: ResolvedVm, outcome: LbOutcome) -> None:
    restore_by_hand = f"its NICs keep what was removed in the tag {nic_pools.TAG}"
    if vm.kind is VmKind.FORBIDDEN:
        log.error(
            "VM %s cannot be restored to its pools: %s; %s",
            vm.name,
            vm.problem,
            restore_by_hand,
            extra={"vm": vm.name, "reason": "PermissionDenied"},
        )
        return
    if vm.kind is not VmKind.VM:
        log.info("nothing to restore", extra={"vm": vm.name, "kind": vm.kind.value})
        return
    for nic_id in vm.nic_ids:
        try:
            changed, gone = _change_nic(arm, nic_id, nic_pools.plan_restore)
        except PermissionDenied as exc:
            log.error(
                "NIC %s cannot be restored to its pools: %s; %s",
                nic_id,
                exc,
                restore_by_hand,
                extra={"vm": vm.name, "nic": nic_id, "reason": "PermissionDenied"},
            )
            continue
        if gone:
            log.warning("NIC not found in ARM, nothing to restore", extra={"nic": nic_id})
        if changed:
            outcome.changed.append(nic_id)


def dropped_resources(message: TransitionMessage) -> list[str]:
    """VMs an Updated transition removed from Resources (from the ``changes`` field)."""
    change = message.data.get("changes", {}).get("Resources")
    if not isinstance(change, dict):
        return []
    before, after = change.get("from"), change.get("to")
    if not isinstance(before, list) or not isinstance(after, list):
        return []
    kept = {str(name).lower() for name in after}
    return [str(name) for name in before if str(name).lower() not in kept]


def handle(
    message: TransitionMessage,
    *,
    arm: ArmClient,
    publisher: TopicPublisher,
    impact: ImpactRules,
    now: datetime,
) -> LbOutcome:
    event = message.event
    if event is None:
        return LbOutcome("ignore", reason="no event")
    if message.transition in DRAIN_ON:
        if not impact.is_impactful(event):
            return LbOutcome("ignore", reason=f"{event.event_type} is not impactful")
        action = "drain"
    elif message.transition in RESTORE_ON:
        if not restores_afterwards(event):
            return LbOutcome("ignore", reason=f"the VM is gone after {event.event_type}")
        action = "restore"
    else:
        return LbOutcome("ignore", reason=f"{message.transition.value} needs nothing")
    outcome = LbOutcome(action)
    vms = affected_vms(event.resources, message.observer)
    try:
        resolved = [resolve(arm, message.observer, name) for name in vms]
    except UnresolvableScope as exc:
        log.error("cannot locate the VMs: %s", exc, extra={"eventId": event.key})
        outcome.reason = str(exc)
        return outcome
    for vm in resolved:
        (_drain_vm if action == "drain" else _restore_vm)(arm, vm, outcome)
    if message.transition is Transition.UPDATED:
        # A VM dropped from Resources is no longer affected: put it back now, since the
        # Completed of this event will not name it.
        for name in dropped_resources(message):
            _restore_vm(arm, resolve(arm, message.observer, name), outcome)
    if action == "drain" and message.transition in PREPARED_AFTER and not outcome.not_ready:
        publisher.publish(
            prepared_message(
                event,
                message.observer,
                message.incarnation or 0,
                now,
                source=SOURCE,
                prepared_vms=list(vms),
                cause=message.message_id or event.key,
                prepared_by="lb-pools",
            )
        )
        outcome.published_prepared = True
    return outcome
