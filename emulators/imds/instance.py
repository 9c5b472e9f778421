"""The IMDS instance document (``/metadata/instance``) built from a scenario's ``vm`` section.

Pure. The shape follows the documented ``compute`` and ``network`` sections; values default
to a plausible scale-set VM so that a forwarder can name itself (compute.name is the session
id of its approvals) without anything configured. ``/vm/<name>/`` gets the same document
with that name and a vmId derived from it, so a fleet of forwarders gets distinct identities.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

DEFAULT_VM: dict[str, Any] = {
    "name": "vmss_vm1",
    "subscriptionId": "00000000-0000-0000-0000-000000000000",
    "resourceGroupName": "rg-sebridge-local",
    "location": "westeurope",
    "zone": "1",
    "vmScaleSetName": "vmss",
    "osType": "Linux",
    "vmSize": "Standard_D2s_v5",
    "privateIpAddress": "10.0.0.4",
    "tags": {},
}
_VM_ID_NAMESPACE = uuid.UUID("6f1d3c2e-5b7a-4e8f-9a0b-1c2d3e4f5a6b")


def vm_settings(overrides: Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """Defaults, then the scenario's ``vm``, then the /vm/<name> prefix; ids derived last."""
    vm = dict(DEFAULT_VM) | dict(overrides)
    if name is not None:
        vm["name"] = name
        # A per-VM prefix must not inherit the scenario's fixed ids.
        vm.pop("vmId", None)
        vm.pop("resourceId", None)
    vm.setdefault("vmId", str(uuid.uuid5(_VM_ID_NAMESPACE, vm["name"])))
    vm.setdefault(
        "resourceId",
        f"/subscriptions/{vm['subscriptionId']}/resourceGroups/{vm['resourceGroupName']}"
        f"/providers/Microsoft.Compute/virtualMachines/{vm['name']}",
    )
    return vm


def instance_document(vm: Mapping[str, Any]) -> dict[str, Any]:
    tags = vm.get("tags", {})
    return {
        "compute": {
            "azEnvironment": "AzurePublicCloud",
            "location": vm["location"],
            "name": vm["name"],
            "offer": "0001-com-ubuntu-server-jammy",
            "osType": vm["osType"],
            "placementGroupId": "",
            "platformFaultDomain": "0",
            "platformUpdateDomain": "0",
            "provider": "Microsoft.Compute",
            "publisher": "Canonical",
            "resourceGroupName": vm["resourceGroupName"],
            "resourceId": vm["resourceId"],
            "sku": "22_04-lts-gen2",
            "subscriptionId": vm["subscriptionId"],
            "tags": ";".join(f"{k}:{v}" for k, v in tags.items()),
            "tagsList": [{"name": k, "value": str(v)} for k, v in tags.items()],
            "version": "22.04.202411010",
            "vmId": vm["vmId"],
            "vmScaleSetName": vm["vmScaleSetName"],
            "vmSize": vm["vmSize"],
            "zone": vm["zone"],
        },
        "network": {
            "interface": [
                {
                    "ipv4": {
                        "ipAddress": [
                            {"privateIpAddress": vm["privateIpAddress"], "publicIpAddress": ""}
                        ],
                        "subnet": [{"address": "10.0.0.0", "prefix": "24"}],
                    },
                    "ipv6": {"ipAddress": []},
                    "macAddress": "6045BD000001",
                }
            ]
        },
    }
