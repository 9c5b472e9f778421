"""A loopback Azure Resource Manager holding VMs, scale-set instances, NICs and load balancers.

It answers the calls the lb-pools and approval-gate adapters make, the way ARM does:
- ``GET .../Microsoft.Compute/virtualMachines/{vm}`` and
  ``.../virtualMachineScaleSets/{ss}/virtualMachines/{id}``: the VM with its NIC ids;
- ``GET/PUT .../Microsoft.Network/networkInterfaces/{nic}`` with ``etag`` and ``If-Match``
  (412 on a stale etag), ARM's 400 ``InvalidResourceReference`` for a pool that does not exist
  (its load balancer deleted, ``remove``, or the pool, ``remove_pool``); a scale-set instance's NIC
  (``.../virtualMachines/{id}/networkInterfaces/{nic}``) can be read but not PUT (405), as in ARM;
- ``POST {vm, scale set or availability set}/providers/Microsoft.Maintenance/scheduledevents/
  {id}/acknowledge``;
- availability sets and scale sets (Flexible: VMs carry ``virtualMachineScaleSet``; Uniform:
  instances under the scale set), every VM with ``properties.vmId`` (by default the one the IMDS
  simulator derives from the VM's name, so a simulated forwarder's observer matches);
- ``GET`` a load balancer with what ARM computes: each pool's ``backendIPConfigurations`` (the
  NIC ip configurations in it now) and ``loadBalancingRules``; ``POST
  .../loadBalancingRules/{rule}/health`` answering ``LoadBalancerHealthPerRule`` (``up``,
  ``down``, ``loadBalancerBackendAddresses`` with ``state`` Up/Down) from probe states the test
  sets (``set_probe``), a member that joined less than ``probe_lag`` seconds ago reporting Down
  (a probe needs time to see it), 202 + Location first when ``health_async`` is set;
- ``slow(seconds, ...)``: matching requests wait before they are handled (outside the lock);
  with ``until=<threading.Event>`` they wait until the test sets it (``seconds`` at most): a
  request held at a chosen point, however fast or slow the machine;
- paths are percent-decoded before they are matched, as ARM does (a client that quotes a
  resource group ``rg(web)`` as ``rg%28web%29`` reaches the same resource, and an id ARM returns
  is spelled without escapes);
- 404 for anything unknown, 401 without ``Authorization: Bearer``, 400 without api-version;
- on demand (``fail``): any status for matching requests, e.g. 409/429/5xx with Retry-After,
  or 403 with ARM's AuthorizationFailed body naming the action and scope the caller lacks
  (``fail(403, times=100, path_contains=...)`` plays a missing role assignment); and
  long-running PUTs answered 201 + Azure-AsyncOperation or 202 + Location, completing after
  some polls.
Every request is recorded; every pool change is kept as a line (``changes``), and as a
timestamped record (``pool_events``: which ip configuration left or joined which pool, when), and
can be printed as it happens for the demo.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from emulators.fakes._server import LoopbackServer, Reply, Request
from emulators.imds.instance import vm_settings

_VM = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"virtualmachines/[^/]+$"
)
_VMSS_VM = re.compile(
    r"^/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"virtualmachinescalesets/[^/]+/virtualmachines/[^/]+$"
)
_HEALTH = re.compile(
    r"^(?P<lb>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.network/"
    r"loadbalancers/[^/]+)/loadbalancingrules/(?P<rule>[^/]+)/health$"
)
_ACK = re.compile(
    r"^(?P<vm>/subscriptions/[^/]+/resourcegroups/[^/]+/providers/microsoft\.compute/"
    r"(?:virtualmachines|virtualmachinescalesets|availabilitysets)/[^/]+)"
    r"/providers/microsoft\.maintenance/scheduledevents/"
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


def simulator_vm_id(name: str) -> str:
    """The vmId the IMDS simulator reports for a VM of this name (emulators.imds.instance)."""
    return str(vm_settings({}, name)["vmId"])


@dataclass(frozen=True)
class PoolEvent:
    at: float  # time.time() when ARM made the change
    nic: str  # the NIC's name
    ip_configuration: str  # its full id, lower case
    pool: str  # the pool's id as written
    joined: bool  # False: left the pool


@dataclass
class Slow:
    seconds: float
    method: str | None
    path_contains: str | None
    times: int
    until: threading.Event | None = None  # held until set (``seconds`` at most)


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
        self.on_request: Callable[[Request], None] | None = None  # called as each one comes
        self._faults: list[Fault] = []
        self.async_mode: str | None = None  # None, "azure-async" or "location"
        self.async_polls = 1  # polls answered "in progress" before the operation ends
        self._operations: dict[str, dict[str, Any]] = {}
        self.pool_events: list[PoolEvent] = []
        self.probe_down: set[str] = set()  # lower-case ip configuration ids probed Down
        self.probe_lag = 0.0  # seconds a member that (re)joined a pool reports Down
        self.health_async = False
        self._joined_at: dict[str, float] = {}  # ip configuration -> monotonic time it joined
        self._rules: dict[str, dict[str, list[str]]] = {}  # lb id -> rule name -> pool ids
        self._slow: list[Slow] = []

    # ---- building the world -------------------------------------------------------------
    def add_load_balancer(
        self,
        subscription: str,
        group: str,
        name: str,
        pools: list[str],
        *,
        rules: dict[str, str | list[str]] | None = None,
    ) -> str:
        """A load balancer with ``pools``; ``rules`` maps a load-balancing rule's name to the
        pool (or pools) it sends traffic to. A pool no rule names has no probe verdict."""
        lb_id = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Network/loadBalancers/{name}"
        )
        rule_pools = {
            rule: [f"{lb_id}/backendAddressPools/{p}" for p in ([t] if isinstance(t, str) else t)]
            for rule, t in (rules or {}).items()
        }
        with self.lock:
            self._rules[lb_id.lower()] = rule_pools
            self.resources[lb_id.lower()] = {
                "id": lb_id,
                "name": name,
                "type": "Microsoft.Network/loadBalancers",
                "etag": f'W/"{uuid.uuid4()}"',
                "properties": {
                    "backendAddressPools": [
                        {"id": f"{lb_id}/backendAddressPools/{p}", "name": p} for p in pools
                    ],
                    "loadBalancingRules": [
                        {
                            "id": f"{lb_id}/loadBalancingRules/{rule}",
                            "name": rule,
                            "properties": {
                                "backendAddressPool": {"id": targets[0]},
                                "backendAddressPools": [{"id": t} for t in targets],
                                "probe": {"id": f"{lb_id}/probes/{rule}-probe"},
                            },
                        }
                        for rule, targets in rule_pools.items()
                    ],
                },
            }
        return lb_id

    def add_availability_set(self, subscription: str, group: str, name: str) -> str:
        set_id = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/availabilitySets/{name}"
        )
        with self.lock:
            self.resources[set_id.lower()] = {
                "id": set_id,
                "name": name,
                "type": "Microsoft.Compute/availabilitySets",
                "properties": {"platformFaultDomainCount": 2, "platformUpdateDomainCount": 5},
            }
        return set_id

    def add_scale_set(
        self, subscription: str, group: str, name: str, *, orchestration: str = "Flexible"
    ) -> str:
        set_id = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{name}"
        )
        with self.lock:
            self.resources[set_id.lower()] = {
                "id": set_id,
                "name": name,
                "type": "Microsoft.Compute/virtualMachineScaleSets",
                "properties": {"orchestrationMode": orchestration},
            }
        return set_id

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
        self,
        subscription: str,
        group: str,
        name: str,
        pools: list[str],
        *,
        ip_configs: int = 1,
        availability_set: str | None = None,
        scale_set: str | None = None,
        vm_id: str | None = None,
    ) -> str:
        """A VM with one NIC whose first ip configuration is in ``pools`` (pool ids), in an
        availability set or a Flexible scale set (their ids) if given. ``vm_id``: its vmId
        (default: what the IMDS simulator reports for ``name``)."""
        base = f"/subscriptions/{subscription}/resourceGroups/{group}/providers"
        resource_id = f"{base}/Microsoft.Compute/virtualMachines/{name}"
        nic_id = f"{base}/Microsoft.Network/networkInterfaces/{name}-nic"
        properties: dict[str, Any] = {
            "vmId": vm_id or simulator_vm_id(name),
            "networkProfile": {"networkInterfaces": [{"id": nic_id}]},
        }
        if availability_set:
            properties["availabilitySet"] = {"id": availability_set}
        if scale_set:
            properties["virtualMachineScaleSet"] = {"id": scale_set}
        with self.lock:
            self.resources[nic_id.lower()] = self._nic(nic_id, f"{name}-nic", pools, ip_configs)
            self.resources[resource_id.lower()] = {
                "id": resource_id,
                "name": name,
                "type": "Microsoft.Compute/virtualMachines",
                "properties": properties,
            }
        return resource_id

    def add_vmss_instance(
        self,
        subscription: str,
        group: str,
        scale_set: str,
        instance_id: str,
        pools: list[str],
        *,
        vm_id: str | None = None,
    ) -> str:
        """An instance of a Uniform scale set (named ``<scaleSet>_<instanceId>`` as IMDS does)."""
        base = (
            f"/subscriptions/{subscription}/resourceGroups/{group}/providers/"
            f"Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{instance_id}"
        )
        nic_id = f"{base}/networkInterfaces/{scale_set}-nic"
        name = f"{scale_set}_{instance_id}"
        with self.lock:
            self.resources[nic_id.lower()] = self._nic(nic_id, f"{scale_set}-nic", pools, 1)
            self.resources[base.lower()] = {
                "id": base,
                "name": name,
                "instanceId": instance_id,
                "properties": {
                    "vmId": vm_id or simulator_vm_id(name),
                    "networkProfile": {"networkInterfaces": [{"id": nic_id}]},
                },
            }
        return base

    def remove(self, resource_id: str) -> None:
        with self.lock:
            self.resources.pop(resource_id.lower(), None)

    def remove_pool(self, pool_id: str) -> None:
        """Delete one backend pool from its load balancer (the load balancer stays)."""
        lb_id, _, name = pool_id.lower().partition("/backendaddresspools/")
        with self.lock:
            lb = self.resources[lb_id]
            pools = lb["properties"]["backendAddressPools"]
            lb["properties"]["backendAddressPools"] = [
                p for p in pools if p["name"].lower() != name
            ]

    def set_probe(self, resource_id: str, *, up: bool) -> None:
        """The load balancer's probe verdict for every ip configuration of a VM, a NIC, or one
        ip configuration (by id)."""
        with self.lock:
            for ipc in self._ip_configurations_of(resource_id):
                (self.probe_down.discard if up else self.probe_down.add)(ipc)

    def slow(
        self,
        seconds: float,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        times: int = 1_000_000,
        until: threading.Event | None = None,
    ) -> None:
        with self.lock:
            self._slow.append(Slow(seconds, method, path_contains, times, until))

    def delay(self, request: Request) -> float:
        gate: Slow | None = None
        with self.lock:
            for slow in self._slow:
                if slow.times <= 0 or (slow.method and slow.method != request.method):
                    continue
                if slow.path_contains and slow.path_contains.lower() not in request.path.lower():
                    continue
                slow.times -= 1
                if slow.until is None:
                    return slow.seconds
                gate = slow
                break
        if gate is not None and gate.until is not None:
            gate.until.wait(gate.seconds)  # outside the lock: other requests go on
        return 0.0

    def _ip_configurations_of(self, resource_id: str) -> list[str]:
        key = resource_id.lower()
        resource = self.resources.get(key)
        if resource is None:
            return [key]  # an ip configuration id
        nics = [resource]
        if resource.get("type") != "Microsoft.Network/networkInterfaces":
            refs = resource.get("properties", {}).get("networkProfile", {})
            nics = [
                self.resources[r["id"].lower()]
                for r in refs.get("networkInterfaces", [])
                if r["id"].lower() in self.resources
            ]
        return [
            config["id"].lower() for nic in nics for config in nic["properties"]["ipConfigurations"]
        ]

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
        """Requests that change something, DELETE included (the health query is a POST that
        changes nothing)."""
        return [
            r
            for r in self.requests
            if r.method in {"PUT", "PATCH", "POST", "DELETE"}
            and not r.path.lower().endswith("/health")
        ]

    def pool_members(self, pool_id: str) -> list[str]:
        """The ip configuration ids (lower case) in a backend pool now, as ARM would list them
        in its ``backendIPConfigurations``."""
        with self.lock:
            wanted = pool_id.lower()
            return sorted(
                config["id"].lower()
                for resource in self.resources.values()
                if resource.get("type") == "Microsoft.Network/networkInterfaces"
                for config in resource["properties"]["ipConfigurations"]
                if wanted in self._pool_set_lower(config)
            )

    def probe_up(self, ip_configuration: str) -> bool:
        key = ip_configuration.lower()
        if key in self.probe_down:
            return False
        joined = self._joined_at.get(key)
        return joined is None or time.monotonic() - joined >= self.probe_lag

    # ---- serving ---------------------------------------------------------------------------
    def handle(self, request: Request) -> Reply:
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return _error(401, "AuthenticationFailed", "Authentication failed.")
        # ARM reads the path percent-decoded: rg%28web%29 is the resource group rg(web).
        request = dataclasses.replace(request, path=unquote(request.path))
        if self.on_request is not None:
            self.on_request(request)
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
        health = _HEALTH.match(path)
        if health and request.method == "POST":
            return self._rule_health(health.group("lb"), health.group("rule"))
        ack = _ACK.match(path)
        if ack and request.method == "POST":
            if ack.group("vm") not in self.resources:
                return _error(404, "ResourceNotFound", "resource not found")
            self.acknowledged.append((self.resources[ack.group("vm")]["id"], ack.group("event")))
            return Reply(200, {"status": "Succeeded"})
        resource = self.resources.get(path)
        if resource is None:
            return _error(404, "ResourceNotFound", f"The resource '{request.path}' was not found.")
        if request.method == "GET":
            headers = {"ETag": resource["etag"]} if "etag" in resource else {}
            if resource.get("type") == "Microsoft.Network/loadBalancers":
                resource = self._load_balancer_view(resource)
            return Reply(200, resource, headers)
        if (
            request.method == "PUT"
            and resource.get("type") == "Microsoft.Network/networkInterfaces"
        ):
            return self._put_nic(path, resource, request)
        if request.method == "PUT" and (_VM.match(path) or _VMSS_VM.match(path)):
            return _error(400, "NotImplementedInFake", "the fake does not update VMs")
        return _error(405, "MethodNotAllowed", f"{request.method} is not allowed here")

    def _load_balancer_view(self, lb: dict[str, Any]) -> dict[str, Any]:
        """The load balancer as ARM shows it: pools list their NIC members and their rules."""
        view = copy.deepcopy(lb)
        rules = self._rules.get(lb["id"].lower(), {})
        for pool in view["properties"]["backendAddressPools"]:
            members = self.pool_members(pool["id"])
            pool["properties"] = {
                "backendIPConfigurations": [{"id": self._spelled(m)} for m in members],
                "loadBalancingRules": [
                    {"id": f"{lb['id']}/loadBalancingRules/{rule}"}
                    for rule, targets in rules.items()
                    if pool["id"].lower() in {t.lower() for t in targets}
                ],
            }
        return view

    def _spelled(self, ip_configuration: str) -> str:
        nic_id = ip_configuration.rsplit("/ipconfigurations/", 1)[0]
        nic = self.resources.get(nic_id)
        for config in (nic or {}).get("properties", {}).get("ipConfigurations", []):
            if config["id"].lower() == ip_configuration:
                return str(config["id"])
        return ip_configuration

    def _rule_health(self, lb_key: str, rule: str) -> Reply:
        if lb_key not in self.resources:
            return _error(404, "ResourceNotFound", "load balancer not found")
        targets = {name.lower(): pools for name, pools in self._rules.get(lb_key, {}).items()}.get(
            rule
        )
        if targets is None:
            return _error(404, "ResourceNotFound", f"load balancing rule {rule} not found")
        addresses = []
        for pool in targets:
            for member in self.pool_members(pool):
                up = self.probe_up(member)
                addresses.append(
                    {
                        "ipAddress": "10.0.0.4",
                        "networkInterfaceIPConfigurationId": self._spelled(member),
                        "state": "Up" if up else "Down",
                        "reason": "Up_Probe_Success" if up else "Down_Probe_HealthProbeFailure",
                    }
                )
        body = {
            "up": sum(a["state"] == "Up" for a in addresses),
            "down": sum(a["state"] == "Down" for a in addresses),
            "loadBalancerBackendAddresses": addresses,
        }
        if not self.health_async:
            return Reply(200, body)
        op = uuid.uuid4().hex
        self._operations[op] = {"remaining": self.async_polls, "body": body}
        url = f"{self.url}/fake/locations/{op}?api-version=2024-05-01"
        return Reply(202, b"", {"Location": url, "Retry-After": "0"})

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
                    return _error(
                        400,
                        "InvalidResourceReference",
                        f"Resource {pool.get('id')} referenced by resource {config.get('id')} was "
                        "not found. Please make sure that the referenced resource exists, and "
                        "that both resources are in the same region.",
                    )
        updated = copy.deepcopy(current)
        updated["tags"] = body.get("tags") or {}
        updated["properties"]["ipConfigurations"] = configs
        updated["etag"] = f'W/"{uuid.uuid4()}"'
        self.resources[path] = updated
        now = time.time()
        for config in configs:
            after = self._pool_set(config)
            old = before.get(config["name"], set())
            ipc = f"{current['id']}/ipConfigurations/{config['name']}".lower()
            for pool in sorted(old - after):
                self.pool_events.append(PoolEvent(now, current["name"], ipc, pool, False))
                self._changed(f"- {current['name']}/{config['name']} left {self._short(pool)}")
            for pool in sorted(after - old):
                self._joined_at[ipc] = time.monotonic()
                self.pool_events.append(PoolEvent(now, current["name"], ipc, pool, True))
                self._changed(f"+ {current['name']}/{config['name']} joined {self._short(pool)}")
        return self._accepted(updated)

    @staticmethod
    def _pool_set(config: dict[str, Any]) -> set[str]:
        pools = config.get("properties", {}).get("loadBalancerBackendAddressPools") or []
        return {p["id"] for p in pools if isinstance(p, dict) and "id" in p}

    @classmethod
    def _pool_set_lower(cls, config: dict[str, Any]) -> set[str]:
        return {p.lower() for p in cls._pool_set(config)}

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
        if not done:
            return Reply(202, b"", {"Retry-After": "0"})
        return Reply(200, op.get("body", b""))
