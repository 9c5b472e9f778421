"""The trust boundary: may the workflows act on what this message says? (core, ARM port)

Every forwarder sends with the same identity, so a message is one VM's claim. IMDS shows an
event only to the VMs of one availability set or scale-set placement group, so an honest
message names only VMs its observer shares one with. The workflows act only within that scope:

1. every name in the message is one Azure would accept (functions.shared.names); anything
   else refuses the whole message;
2. with ``LB_MANAGED_RESOURCE_GROUPS`` set, the observer's resource group (where every VM the
   message names is looked up) must be in it;
3. the observer exists in ARM under the subscription, resource group and name it claims, with
   the vmId (and resource id, and scale set) it claims;
4. each affected VM is the observer itself, or a VM of the observer's availability set or
   scale set (ARM's answer, not the message's). One VM outside that scope refuses the whole
   message: IMDS never shows such a document, so the message is forged or garbled.

Messages the app published itself (transitions derived from Event Grid, lb-pools' Prepared and
Held) carry its seal (functions.shared.seal). For those, step 3 checks what the app checked
when it published them: the observer exists as claimed (a VM by name and id; a scale set or
availability set, which is what Event Grid names for their events, by its id) without a vmId,
which only a VM's own IMDS knows. A message that claims Event Grid as its source, or carries a
seal, without a seal that verifies is refused: a VM cannot pass itself off as Azure or the app.

A refusal is a security event: logged on ``sebridge.security`` with the message id, and nothing
is changed. A VM the app may not read (403) is not a refusal of the message: that VM resolves
as ``forbidden`` and is left alone (the existing permission semantics); an observer the app may
not read cannot be verified, so the message is refused, logged as a missing permission.
ARM reads go through the port; the composition root caches them (functions.adapters.arm_cache).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass

from functions.shared import event_record, names, seal
from functions.shared.ports import ArmClient, EventRecords, PermissionDenied, VmRecord
from functions.shared.vms import ResolvedVm, VmKind, affected_vms, lookup
from sebridge.contract.events import Observer, TransitionMessage

security_log = logging.getLogger("sebridge.security")


@dataclass(frozen=True)
class TrustRules:
    managed_groups: frozenset[str] = frozenset()  # lower case; empty: no allow-list
    seal_key: bytes | None = None  # the app's seal (functions.shared.seal); None: trust none

    @classmethod
    def of(cls, groups: Collection[str], seal_key: bytes | None = None) -> TrustRules:
        return cls(frozenset(g.strip().lower() for g in groups if g.strip()), seal_key)

    def group_allowed(self, group: str) -> bool:
        return not self.managed_groups or group.lower() in self.managed_groups


@dataclass(frozen=True)
class Refusal:
    reason: str
    security: bool = True  # False: a permission problem on our side, not a forged claim


@dataclass(frozen=True)
class Scope:
    observer: VmRecord
    vms: tuple[ResolvedVm, ...]  # the affected VMs, in the message's order


def _check_observer_names(observer: Observer, rules: TrustRules) -> None:
    """Raises InvalidName or returns; the allow-list is checked by the caller."""
    names.VIRTUAL_MACHINE.check(observer.vm_name, "observer.vmName")
    names.subscription_id(observer.subscription_id, "observer.subscriptionId")
    names.resource_group(observer.resource_group, "observer.resourceGroup")
    if observer.vm_scale_set_name:
        names.SCALE_SET.check(observer.vm_scale_set_name, "observer.vmScaleSetName")
    try:
        uuid.UUID(observer.vm_id)
    except (ValueError, TypeError):
        raise names.InvalidName("observer.vmId", observer.vm_id, "is not a GUID") from None


def verify_observer(arm: ArmClient, observer: Observer, rules: TrustRules) -> VmRecord | Refusal:
    """The observer as ARM knows it, or why it cannot be trusted."""
    try:
        _check_observer_names(observer, rules)
    except names.InvalidName as exc:
        return Refusal(f"invalid name: {exc}")
    if not rules.group_allowed(observer.resource_group):
        return Refusal(
            f"resource group {names.excerpt(observer.resource_group)} is not in "
            "LB_MANAGED_RESOURCE_GROUPS"
        )
    try:
        record = lookup(arm, observer, observer.vm_name)
    except PermissionDenied as exc:
        return Refusal(f"the observer cannot be verified: {exc}", security=False)
    if record is None:
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} does not exist in resource group "
            f"{names.excerpt(observer.resource_group)} of subscription {observer.subscription_id}"
        )
    if record.vm_id.lower() != observer.vm_id.lower():
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} claims vmId "
            f"{names.excerpt(observer.vm_id)}, ARM says {record.vm_id or 'none'}"
        )
    if observer.resource_id and not names.same(observer.resource_id, record.id):
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} claims resource id "
            f"{names.excerpt(observer.resource_id, 120)}, ARM says {record.id}"
        )
    claimed_set = observer.vm_scale_set_name.lower()
    if claimed_set and not record.scale_set.endswith(f"/virtualmachinescalesets/{claimed_set}"):
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} claims scale set "
            f"{names.excerpt(observer.vm_scale_set_name)}, ARM says "
            f"{record.scale_set.rsplit('/', 1)[-1] or 'none'}"
        )
    return record


_COMPUTE = "/providers/microsoft.compute/"
_SETS = ("virtualmachinescalesets", "availabilitysets")


def from_event_grid(message: TransitionMessage) -> bool:
    """Does the message say it was derived from an Event Grid notification (agentless)?"""
    return "eventGrid" in message.data


def sealed_set_kind(observer: Observer) -> str | None:
    """``virtualmachinescalesets`` or ``availabilitysets`` when a sealed message's observer is
    the scale set or availability set Azure named (its claimed resource id says so), else None
    (a VM)."""
    claimed_id = observer.resource_id.lower()
    for kind in _SETS:
        expected = (
            f"/subscriptions/{observer.subscription_id}/resourcegroups/"
            f"{observer.resource_group}{_COMPUTE}{kind}/{observer.vm_name}"
        ).lower()
        if claimed_id == expected:
            return kind
    return None


def verify_sealed_observer(
    arm: ArmClient,
    observer: Observer,
    rules: TrustRules,
    *,
    event_id: str | None = None,
    records: EventRecords | None = None,
) -> VmRecord | Refusal:
    """The observer of a message the app sealed: a VM as ARM knows it (its vmId is checked when
    the message carries one), or the scale set or availability set Azure named (its name checked
    by the rule of its own type: an availability set's may be 80 characters long).

    A VM that no longer exists (a Completed after a Terminate or Preempt deleted it) is not a
    forged claim: the seal proves Azure reported the event. It verifies as *gone*: nothing to
    drain or approve on it, but what the message closes (an alert) is closed, in the scope the
    VM was verified in for this event (the event's record, ``records``), else its own."""
    kind = sealed_set_kind(observer)
    try:
        (names.BY_TYPE[kind] if kind else names.VIRTUAL_MACHINE).check(
            observer.vm_name, "observer.vmName"
        )
        names.subscription_id(observer.subscription_id, "observer.subscriptionId")
        names.resource_group(observer.resource_group, "observer.resourceGroup")
        if observer.vm_scale_set_name:
            names.SCALE_SET.check(observer.vm_scale_set_name, "observer.vmScaleSetName")
    except names.InvalidName as exc:
        return Refusal(f"invalid name: {exc}")
    if not rules.group_allowed(observer.resource_group):
        return Refusal(
            f"resource group {names.excerpt(observer.resource_group)} is not in "
            "LB_MANAGED_RESOURCE_GROUPS"
        )
    if kind is not None:
        claimed_id = observer.resource_id.lower()
        is_scale_set = kind == "virtualmachinescalesets"
        return VmRecord(
            id=observer.resource_id,
            name=observer.vm_name,
            vm_id="",
            nic_ids=(),
            availability_set="" if is_scale_set else claimed_id,
            scale_set=claimed_id if is_scale_set else "",
        )
    try:
        record = lookup(arm, observer, observer.vm_name)
    except PermissionDenied as exc:
        return Refusal(f"the observer cannot be verified: {exc}", security=False)
    if record is None:
        return gone_observer(observer, event_id, records)
    if observer.vm_id and record.vm_id.lower() != observer.vm_id.lower():
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} claims vmId "
            f"{names.excerpt(observer.vm_id)}, ARM says {record.vm_id or 'none'}"
        )
    if observer.resource_id and not names.same(observer.resource_id, record.id):
        return Refusal(
            f"observer {names.excerpt(observer.vm_name)} claims resource id "
            f"{names.excerpt(observer.resource_id, 120)}, ARM says {record.id}"
        )
    return record


def gone_observer(
    observer: Observer, event_id: str | None, records: EventRecords | None
) -> VmRecord:
    """The record of a sealed message's VM observer that no longer exists: its placement is the
    one it was verified in for this event, when the event's record remembers it, else its own
    id (a standalone VM's placement)."""
    resource_id = observer.resource_id or (
        f"/subscriptions/{observer.subscription_id}/resourceGroups/{observer.resource_group}"
        f"{_COMPUTE}virtualMachines/{observer.vm_name}"
    )
    placement = None
    if records is not None and event_id:
        placement = event_record.placement_of(records.read_event(event_id), resource_id)
    where = (placement or resource_id).lower()
    security_log.info(
        "observer %s no longer exists: Azure's own (sealed) message, resolved as gone",
        names.excerpt(observer.vm_name),
        extra={"observer": names.excerpt(observer.vm_name), "placement": where},
    )
    return VmRecord(
        id=resource_id,
        name=observer.vm_name,
        vm_id="",
        nic_ids=(),
        availability_set=where if "/availabilitysets/" in where else "",
        scale_set=where if "/virtualmachinescalesets/" in where else "",
        gone=True,
    )


def shares_placement(observer: VmRecord, other: VmRecord) -> bool:
    """Could IMDS have shown ``observer`` an event of ``other``: the same availability set or
    the same scale set."""
    if observer.availability_set and other.availability_set == observer.availability_set:
        return True
    return bool(observer.scale_set) and other.scale_set == observer.scale_set


def check(
    arm: ArmClient,
    message: TransitionMessage,
    rules: TrustRules,
    *,
    records: EventRecords | None = None,
) -> Scope | Refusal:
    """The scope of ``message``: its observer and affected VMs resolved, or a refusal.
    ``records``: the events' records, for the scope a sealed message's gone VM was in."""
    if seal.is_sealed(message) or from_event_grid(message):
        if rules.seal_key is None or not seal.verify(message, rules.seal_key):
            return Refusal(
                "the message claims the app's seal or Event Grid as its source, and its seal "
                "does not verify"
            )
        event = message.event
        observer = verify_sealed_observer(
            arm,
            message.observer,
            rules,
            event_id=event.key if event is not None else None,
            records=records,
        )
    else:
        observer = verify_observer(arm, message.observer, rules)
    if isinstance(observer, Refusal):
        return observer
    event = message.event
    vms = resolve_names(
        arm,
        observer,
        message.observer,
        affected_vms(event.resources if event else (), message.observer),
    )
    return vms if isinstance(vms, Refusal) else Scope(observer, vms)


def resolve_names(
    arm: ArmClient, observer: VmRecord, claim: Observer, vm_names: Collection[str]
) -> tuple[ResolvedVm, ...] | Refusal:
    """``vm_names`` (from the message) resolved in the verified observer's scope, or a refusal
    when one of them is not a valid name or lies outside that scope."""
    try:
        for name in vm_names:
            names.compute_name(name, "Resources[]")
    except names.InvalidName as exc:
        return Refusal(f"invalid name: {exc}")
    resolved: list[ResolvedVm] = []
    # The observer is one of the VMs only when it is a VM: Event Grid names a scale set or an
    # availability set as the observer, and a VM may have the same name as its set (another
    # resource type), so a name is always looked up then.
    observer_is_vm = sealed_set_kind(claim) is None
    for name in vm_names:
        if observer_is_vm and names.same(name, claim.vm_name):
            gone = ResolvedVm(name, VmKind.GONE)
            resolved.append(gone if observer.gone else ResolvedVm.of(name, observer))
            continue
        try:
            record = lookup(arm, claim, name)
        except PermissionDenied as exc:
            resolved.append(ResolvedVm(name, VmKind.FORBIDDEN, problem=str(exc)))
            continue
        if record is None:
            resolved.append(ResolvedVm(name, VmKind.GONE))
            continue
        if not shares_placement(observer, record):
            return Refusal(
                f"{names.excerpt(name)} is neither the observer {names.excerpt(claim.vm_name)} "
                "nor in its availability set or scale set: IMDS would not have shown it this event"
            )
        resolved.append(ResolvedVm.of(name, record))
    return tuple(resolved)


def nic_allowed(nic_id: str, rules: TrustRules) -> bool:
    """A NIC may be changed only in an allowed resource group (when the allow-list is set)."""
    if not rules.managed_groups:
        return True
    parts = [p.lower() for p in nic_id.strip("/").split("/")]
    try:
        group = parts[parts.index("resourcegroups") + 1]
    except (ValueError, IndexError):
        return False
    return group in rules.managed_groups


def log_refusal(workflow: str, message: TransitionMessage, refusal: Refusal) -> None:
    fields = {
        "workflow": workflow,
        "messageId": message.message_id,
        "eventId": message.event_id,
        "transition": message.transition.value,
        "observer": names.excerpt(message.observer.vm_name),
        "reason": refusal.reason,
    }
    if refusal.security:
        security_log.warning(
            "security: %s refused message %s and changed nothing: %s",
            workflow,
            message.message_id,
            refusal.reason,
            extra={**fields, "securityEvent": True},
        )
    else:
        logging.getLogger(f"sebridge.functions.{workflow}").error(
            "%s left message %s alone: %s",
            workflow,
            message.message_id,
            refusal.reason,
            extra={**fields, "securityEvent": False, "problem": "PermissionDenied"},
        )
