"""A loopback Azure Resource Manager holding VMs, scale-set instances, NICs and load balancers.

It answers the calls the lb-pools and approval-gate adapters make, the way ARM does:
- ``GET .../Microsoft.Compute/virtualMachines/{vm}`` and
  ``.../virtualMachineScaleSets/{ss}/virtualMachines/{id}``: the VM with its NIC ids;
- ``GET/PUT .../Microsoft.Network/networkInterfaces/{nic}`` with ``etag`` and ``If-Match``
  (412 on a stale etag), a 400 for a pool that does not exist; a scale-set instance's NIC
  (``.../virtualMachines/{id}/networkInterfaces/{nic}``) can be read but not PUT (405), as in ARM;
- ``POST {vm}/providers/Microsoft.Maintenance/scheduledevents/{id}/acknowledge``;
- 404 for anything unknown, 401 without ``Authorization: Bearer``, 400 without api-version;
- on demand (``fail``): any status for matching requests, e.g. 409/429/5xx with Retry-After,
  or 403 with ARM's AuthorizationFailed body naming the action and scope the caller lacks
  (``fail(403, times=100, path_contains=...)`` plays a missing role assignment); and
  long-running PUTs answered 201 + Azure-AsyncOperation or 202 + Location, completing after
  some polls.
Every request is recorded; every pool change is kept as a line (``changes``) and can be
printed as it happens for the demo.
"""

from __future__ import annotations

import copy
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulators.fakes._server import LoopbackServer, Reply, Request

_VM = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"virtualmachines/[^/]+$"
)
_VMSS_VM = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"virtualmachinescalesets/[^/]+/virtualmachines/[^/]+$"
)
_ACK = re.compile(
    r"^(?P<vm>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"virtualmachines/[^/]+)/providers/microsoft\.maintenance/scheduledevents/"
    r"(?P<event>[^/]+)/acknowledge$"
)


def _error(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}})


def rbac_action(method: str, path: str) -> str:
    """The RBAC action ARM checks for a request, e.g. ``Microsoft.Compute/virtualMachines/read``
    (resource types are every other segment after the last ``providers/<namespace>``)."""
    parts = path.strip("/").split("/")
    lower = [part.lower() for part in parts]
    if "providers" not in lower:
        return f"Microsoft.Resources/subscriptions/resourceGroups/{method.lower()}"
    at = len(lower) - 1 - lower[::-1].index("providers")
    namespace, rest = parts[at + 1], parts[at + 2 :]
    types = "/".join(rest[0::2])
    if method == "POST":
        return f"{namespace}/{types}/action"
    verb = {"GET": "read", "PUT": "write", "PATCH": "write", "DELETE": "delete"}[method]
    return f"{namespace}/{types}/{verb}"


def _authorization_failed(request: Request) -> Reply:
    """ARM's 403 for a principal without the needed role assignment (the same wording)."""
    return _error(
        403,
        "AuthorizationFailed",
        "The client 'fake-app' with object id '00000000-0000-0000-0000-0000000000a1' does not "
        f"have authorization to perform action '{rbac_action(request.method, request.path)}' "
        f"over scope '{request.path}' or the scope is invalid. If access was recently granted, "
        "please refresh your credentials.",
    )


@dataclass
class Fault:
    status: int
    times: int
    retry_after: str | None
    method: str | None
    path_contains: str | None

    def matches(self, request: Request) -> bool:
        if self.method and request.method != self.method:
            return False
        return not self.path_contains or self.path_contains.lower() in request.path.lower()


class FakeArm(LoopbackServer):
    def __init__(self, *, print_changes: bool = False) -> None:
        super().__init__()
        self.resources: dict[str, dict[str, Any]] = {}  # lower-case id -> document
        self.acknowledged: list[tuple[str, str]] = []  # (VM id, event id)
        self.changes: list[str] = []
        self.print_changes = print_changes
        self.on_change: Callable[[str], None] | None = None
        self._faults: list[Fault] = []
        self.async_mode: str | None = None  # None, "azure-async" or "location"
        self.async_polls = 1  # polls answered "in progress" before the operation ends
        self._operations: dict[str, dict[str, Any]] = {}

    # ---- building the world -------------------------------------------------------------
    def add_load_balancer(self, subscription: str, group: str, name: str, pools: list[str]) -> str:
        lb_id = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Network/loadBalancers/{name}"
        )
        with self.lock:
            self.resources[lb_id.lower()] = {
                "id": lb_id,
                "name": name,
                "type": "Microsoft.Network/loadBalancers",
                "properties": {
                    "backendAddressPools": [
                        {"id": f"{lb_id}/backendAddressPools/{p}", "name": p} for p in pools
                    ]
                },
            }
        return lb_id

    @staticmethod
    def _nic(nic_id: str, name: str, pools: list[str], ip_configs: int) -> dict[str, Any]:
        return {
            "id": nic_id,
            "name": name,
            "type": "Microsoft.Network/networkInterfaces",
            "etag": f'W/"{uuid.uuid4()}"',
            "location": "westeurope",
            "tags": {"owner": "web-team"},
            "properties": {
                "provisioningState": "Succeeded",
                "ipConfigurations": [
                    {
                        "id": f"{nic_id}/ipConfigurations/ipconfig{n}",
                        "name": f"ipconfig{n}",
                        "properties": {
                            "privateIPAddress": f"10.0.0.{4 + n}",
                            "loadBalancerBackendAddressPools": [{"id": p} for p in pools]
                            if n == 1
                            else [],
                        },
                    }
                    for n in range(1, ip_configs + 1)
                ],
            },
        }

    def add_vm(
        self, subscription: str, group: str, name: str, pools: list[str], *, ip_configs: int = 1
    ) -> str:
        """A VM with one NIC whose first ip configuration is in ``pools`` (pool ids)."""
        base = f"/subscriptions/{subscription}/resourceGroups/{group}/providers"
        vm_id = f"{base}/Microsoft.Compute/virtualMachines/{name}"
        nic_id = f"{base}/Microsoft.Network/networkInterfaces/{name}-nic"
        with self.lock:
            self.resources[nic_id.lower()] = self._nic(nic_id, f"{name}-nic", pools, ip_configs)
            self.resources[vm_id.lower()] = {
                "id": vm_id,
                "name": name,
                "type": "Microsoft.Compute/virtualMachines",
                "properties": {"networkProfile": {"networkInterfaces": [{"id": nic_id}]}},
            }
        return vm_id

    def add_vmss_instance(
        self, subscription: str, group: str, scale_set: str, instance_id: str, pools: list[str]
    ) -> str:
        base = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{instance_id}"
        )
        nic_id = f"{base}/networkInterfaces/{scale_set}-nic"
        with self.lock:
            self.resources[nic_id.lower()] = self._nic(nic_id, f"{scale_set}-nic", pools, 1)
            self.resources[base.lower()] = {
                "id": base,
                "name": f"{scale_set}_{instance_id}",
                "instanceId": instance_id,
                "properties": {"networkProfile": {"networkInterfaces": [{"id": nic_id}]}},
            }
        return base

    def remove(self, resource_id: str) -> None:
        with self.lock:
            self.resources.pop(resource_id.lower(), None)

    def fail(
        self,
        status: int,
        times: int = 1,
        *,
        retry_after: str | None = None,
        method: str | None = None,
        path_contains: str | None = None,
    ) -> None:
        with self.lock:
            self._faults.append(Fault(status, times, retry_after, method, path_contains))

    # ---- reading the world (tests, demo) --------------------------------------------------
    def nic(self, nic_id: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.resources[nic_id.lower()])

    def vm_pools(self, vm_id: str) -> list[str]:
        """Every backend pool id any NIC of the VM is in now."""
        with self.lock:
            vm = self.resources[vm_id.lower()]
            result: list[str] = []
            for ref in vm["properties"]["networkProfile"]["networkInterfaces"]:
                nic = self.resources.get(ref["id"].lower())
                for config in (nic or {}).get("properties", {}).get("ipConfigurations", []):
                    for pool in config["properties"].get("loadBalancerBackendAddressPools") or []:
                        result.append(pool["id"])
            return result

    def writes(self) -> list[Request]:
        return [r for r in self.requests if r.method in {"PUT", "PATCH", "POST"}]

    # ---- serving ---------------------------------------------------------------------------
    def handle(self, request: Request) -> Reply:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return _error(401, "AuthenticationFailed", "Authentication failed.")
        path = request.path.rstrip("/").lower()
        if path.startswith("/fake/operations/") or path.startswith("/fake/locations/"):
            return self._operation(path)
        for fault in self._faults:
            if fault.times > 0 and fault.matches(request):
                fault.times -= 1
                if fault.status == 403:
                    return _authorization_failed(request)
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                codes = {409: "Conflict", 429: "TooManyRequests"}
                reply = _error(fault.status, codes.get(fault.status, "InternalError"), "injected")
                reply.headers.update(headers)
                return reply
        if "api-version" not in request.query:
            return _error(400, "MissingApiVersionParameter", "The api-version is required.")
        ack = _ACK.match(path)
        if ack and request.method == "POST":
            if ack.group("vm") not in self.resources:
                return _error(404, "ResourceNotFound", "VM not found")
            self.acknowledged.append((self.resources[ack.group("vm")]["id"], ack.group("event")))
            return Reply(200, {"status": "Succeeded"})
        resource = self.resources.get(path)
        if resource is None:
            return _error(404, "ResourceNotFound", f"The resource '{request.path}' was not found.")
        if request.method == "GET":
            headers = {"ETag": resource["etag"]} if "etag" in resource else {}
            return Reply(200, resource, headers)
        if (
            request.method == "PUT"
            and resource.get("type") == "Microsoft.Network/networkInterfaces"
        ):
            return self._put_nic(path, resource, request)
        if request.method == "PUT" and (_VM.match(path) or _VMSS_VM.match(path)):
            return _error(400, "NotImplementedInFake", "the fake does not update VMs")
        return _error(405, "MethodNotAllowed", f"{request.method} is not allowed here")

    def _pool_exists(self, pool_id: str) -> bool:
        lb_id, _, name = pool_id.lower().partition("/backendaddresspools/")
        lb = self.resources.get(lb_id)
        pools = (lb or {}).get("properties", {}).get("backendAddressPools", [])
        return any(p["name"].lower() == name for p in pools)

    def _put_nic(self, path: str, current: dict[str, Any], request: Request) -> Reply:
        if_match = request.headers.get("if-match")
        if if_match and if_match != current["etag"]:
            return _error(412, "PreconditionFailed", "The etag does not match.")
        try:
            body = request.json()
            configs = body["properties"]["ipConfigurations"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "InvalidRequestFormat", "Cannot parse the request.")
        for tag, value in (body.get("tags") or {}).items():
            if len(str(value)) > 256 or len(tag) > 512:
                return _error(400, "InvalidTagNameOrValue", f"tag {tag} is too long")
        before = {c["name"]: self._pool_set(c) for c in current["properties"]["ipConfigurations"]}
        for config in configs:
            for pool in config.get("properties", {}).get("loadBalancerBackendAddressPools") or []:
                if not self._pool_exists(pool.get("id", "")):
                    return _error(400, "InvalidResourceReference", f"{pool.get('id')} not found")
        updated = copy.deepcopy(current)
        updated["tags"] = body.get("tags") or {}
        updated["properties"]["ipConfigurations"] = configs
        updated["etag"] = f'W/"{uuid.uuid4()}"'
        self.resources[path] = updated
        for config in configs:
            after = self._pool_set(config)
            old = before.get(config["name"], set())
            for pool in sorted(old - after):
                self._changed(f"- {current['name']}/{config['name']} left {self._short(pool)}")
            for pool in sorted(after - old):
                self._changed(f"+ {current['name']}/{config['name']} joined {self._short(pool)}")
        return self._accepted(updated)

    @staticmethod
    def _pool_set(config: dict[str, Any]) -> set[str]:
        pools = config.get("properties", {}).get("loadBalancerBackendAddressPools") or []
        return {p["id"] for p in pools if isinstance(p, dict) and "id" in p}

    @staticmethod
    def _short(pool_id: str) -> str:
        parts = pool_id.split("/")
        return f"{parts[-3]}/{parts[-1]}"

    def _changed(self, line: str) -> None:
        self.changes.append(line)
        if self.print_changes:
            print(f"[arm] {line}", flush=True)
        if self.on_change is not None:
            self.on_change(line)

    def _accepted(self, resource: dict[str, Any]) -> Reply:
        if self.async_mode is None:
            return Reply(200, resource)
        op = uuid.uuid4().hex
        self._operations[op] = {"remaining": self.async_polls}
        if self.async_mode == "azure-async":
            url = f"{self.url}/fake/operations/{op}?api-version=2024-05-01"
            return Reply(201, resource, {"Azure-AsyncOperation": url, "Retry-After": "0"})
        url = f"{self.url}/fake/locations/{op}?api-version=2024-05-01"
        return Reply(202, b"", {"Location": url, "Retry-After": "0"})

    def _operation(self, path: str) -> Reply:
        op = self._operations.get(path.rsplit("/", 1)[-1])
        if op is None:
            return _error(404, "OperationNotFound", "no such operation")
        done = op["remaining"] <= 0
        op["remaining"] -= 1
        if path.startswith("/fake/operations/"):
            status = "Succeeded" if done else "InProgress"
            return Reply(200, {"status": status}, {"Retry-After": "0"})
        return Reply(200, b"") if done else Reply(202, b"", {"Retry-After": "0"})
