"""Resolving an event's Resources to network interfaces through the ARM port (core).

IMDS names affected VMs, not ARM ids. Availability-set and standalone VMs, and the VMs of
Flexible scale sets, are ordinary VMs: looked up by name in the observer's resource group.
Uniform scale-set instances are named ``<scaleSet>_<instanceId>`` and are found through the
scale-set VM API; their NICs live in the scale-set model and can't be PUT one by one (see
the README, Workflows), so they resolve as ``uniform`` and lb-pools leaves them alone.
A VM that ARM will not show us (403) resolves as ``forbidden``: nothing may be changed on it
and it never counts as prepared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from functions.shared.ports import ArmClient, PermissionDenied
from sebridge.contract.events import Observer


class VmKind(StrEnum):
    VM = "vm"  # a VM resource with NICs we can change
    UNIFORM = "uniform"  # a Uniform scale-set instance: NICs read-only per instance
    GONE = "gone"  # 404: nothing to drain, nothing to restore
    FORBIDDEN = "forbidden"  # 403: the app may not read it; left exactly as it is


@dataclass(frozen=True)
class ResolvedVm:
    name: str
    kind: VmKind
    nic_ids: tuple[str, ...] = ()
    problem: str = ""  # FORBIDDEN: which permission is missing on which scope


class UnresolvableScope(ValueError):
    """The message does not say which subscription and resource group the VMs are in."""


def resolve(arm: ArmClient, observer: Observer, vm_name: str) -> ResolvedVm:
    subscription, group = observer.subscription_id, observer.resource_group
    if not subscription or not group:
        raise UnresolvableScope(
            f"observer {observer.vm_name} carries no subscriptionId/resourceGroup"
        )
    try:
        nics = arm.vm_nic_ids(subscription, group, vm_name)
        if nics is not None:
            return ResolvedVm(vm_name, VmKind.VM, tuple(nics))
        scale_set = observer.vm_scale_set_name
        match = re.fullmatch(rf"{re.escape(scale_set)}_(\d+)", vm_name) if scale_set else None
        if match:
            nics = arm.vmss_vm_nic_ids(subscription, group, scale_set, match.group(1))
            if nics is not None:
                return ResolvedVm(vm_name, VmKind.UNIFORM, tuple(nics))
    except PermissionDenied as exc:
        return ResolvedVm(vm_name, VmKind.FORBIDDEN, problem=str(exc))
    return ResolvedVm(vm_name, VmKind.GONE)


def affected_vms(resources: tuple[str, ...], observer: Observer) -> tuple[str, ...]:
    """The VMs an event names; an event without Resources concerns the observer."""
    return resources or (observer.vm_name,)
