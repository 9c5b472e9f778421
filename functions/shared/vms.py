"""The VMs an event concerns, as ARM knows them (core).

IMDS names affected VMs, not ARM ids. Availability-set and standalone VMs, and the VMs of
Flexible scale sets, are ordinary VMs: looked up by name in the observer's resource group.
Uniform scale-set instances are named ``<scaleSet>_<instanceId>`` and are found through the
scale-set VM API; their NICs live in the scale-set model and can't be PUT one by one (see
the docs/workflows.md), so they resolve as ``uniform`` and lb-pools leaves them alone.
A VM that ARM will not show us (403) resolves as ``forbidden``: nothing may be changed on it
and it never counts as prepared. Which VMs may be resolved at all is the scope check's
business (functions.shared.scope): names reach this module only after it checked them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from functions.shared.ports import ArmClient, VmRecord
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
    record: VmRecord | None = None

    @classmethod
    def of(cls, name: str, record: VmRecord) -> ResolvedVm:
        kind = VmKind.UNIFORM if record.uniform else VmKind.VM
        return cls(name, kind, record.nic_ids, record=record)


def lookup(arm: ArmClient, observer: Observer, vm_name: str) -> VmRecord | None:
    """The VM called ``vm_name`` in the observer's resource group: a VM resource, else (when the
    observer is in a scale set and the name is ``<scaleSet>_<n>``) a Uniform instance.
    Raises PermissionDenied on 403."""
    subscription, group = observer.subscription_id, observer.resource_group
    record = arm.get_vm(subscription, group, vm_name)
    if record is not None:
        return record
    scale_set = observer.vm_scale_set_name
    match = re.fullmatch(rf"{re.escape(scale_set)}_(\d{{1,10}})", vm_name) if scale_set else None
    if match:
        return arm.get_scale_set_vm(subscription, group, scale_set, match.group(1))
    return None


def affected_vms(resources: tuple[str, ...], observer: Observer) -> tuple[str, ...]:
    """The VMs an event names; an event without Resources concerns the observer."""
    return resources or (observer.vm_name,)
