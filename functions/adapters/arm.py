"""ARM REST through requests with a bearer token from azure-identity.

api-versions are pinned so a service-side default never changes the documents we read:
Microsoft.Compute 2024-07-01 (VMs, scale-set VMs), Microsoft.Network 2024-05-01 (NICs,
including a scale-set instance's NICs under Microsoft.Compute/virtualMachineScaleSets/...,
load balancers and the load-balancing-rule health API), Microsoft.Maintenance
2023-10-01-preview for the scheduled-event acknowledge API.
Names are checked by the caller and checked again here (functions.shared.names), then quoted
with nothing kept safe; ids from ARM documents are accepted only as plain
``/subscriptions/...`` paths without ``.``/``..`` segments, query or fragment.
409, 429 and 5xx are retried (Retry-After honoured, bounded); a write (NIC PUT, acknowledge)
made under a pool's lease is attempted only while the lease is provably held, and not retried
past it (functions.shared.write_window); long-running PUTs are followed
through Azure-AsyncOperation or Location like the ARM SDKs do. A 403 on a read or on the NIC
write raises :class:`PermissionDenied` naming the missing RBAC action and its scope (ARM's own
AuthorizationFailed message names both; else the action the call needs): no retry repairs it.
A 401 stays an :class:`ArmError` (redelivered): it is about the token, which the credential
fetches anew when it expires, not about a role on one scope.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

import requests

from functions.adapters.retry import RetryPolicy, TransientHttpError, retry_after, send
from functions.adapters.sessions import Session
from functions.shared import names, tracing, write_window
from functions.shared.ports import (
    AcknowledgeRefused,
    ArmDocument,
    PermissionDenied,
    PreconditionFailed,
    ReferenceMissing,
    VmRecord,
    WriteRefused,
)
from sebridge.contract.commands import CommandError, canonical_event_id

log = logging.getLogger("sebridge.functions.arm")

COMPUTE_API = "2024-07-01"
NETWORK_API = "2024-05-01"
# POST {VM resource id}/providers/Microsoft.Maintenance/scheduledevents/{eventId}/acknowledge
# "Post Scheduled Event Acknowledgement", operation ScheduledEventOperationGroup_Acknowledge,
# api-version 2023-10-01-preview: https://learn.microsoft.com/dotnet/api/
# azure.resourcemanager.maintenance.maintenanceextensions.acknowledge (also
# `az maintenance scheduledevents acknowledge`, supported for virtualMachines,
# virtualMachineScaleSets and availabilitySets).
MAINTENANCE_API = "2023-10-01-preview"
ARM_RETRY = RetryPolicy(attempts=4, max_total_wait=30.0, statuses=(409, 429, 500, 502, 503, 504))
MAX_POLLS = 60
MAX_POLL_SECONDS = 120.0
TERMINAL = {"succeeded", "failed", "canceled", "cancelled"}
# The RBAC action each call needs (named when ARM answers 403 without saying which).
READ_VM = "Microsoft.Compute/virtualMachines/read"
READ_SCALE_SET_VM = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
READ_SCALE_SET_VM_NIC = (
    "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/networkInterfaces/read"
)
READ_NIC = "Microsoft.Network/networkInterfaces/read"
WRITE_NIC = "Microsoft.Network/networkInterfaces/write"
ACKNOWLEDGE = "Microsoft.Maintenance/scheduledevents/acknowledge/action"
READ_LB = "Microsoft.Network/loadBalancers/read"
RULE_HEALTH = "Microsoft.Network/loadBalancers/loadBalancingRules/health/action"
# ARM's AuthorizationFailed: "... does not have authorization to perform action '<action>' over
# scope '<scope>' or the scope is invalid. ..."
_AUTHORIZATION_FAILED = re.compile(r"perform action '([^']+)' over scope '([^']+)'")


class TokenCredential(Protocol):
    def get_token(self, *scopes: str) -> Any: ...


# The answers to a write that no retry of the same write changes (401: the token, 403: the role,
# 404: gone, 408 and 429: busy, 409: another operation, 412: a newer version, each handled apart).
LASTING_4XX = frozenset(range(400, 500)) - {401, 403, 404, 408, 409, 412, 429}


class ArmError(Exception):
    """ARM refused the request (a 4xx other than 403, 404 and 412); the message is redelivered."""


_ID_SEGMENT = re.compile(r"[^/?#%\\\x00-\x1f\x7f]+")


def checked_id(resource_id: str) -> str:
    """An ARM id from a document, fit to be a URL path: ``/subscriptions/...`` made of plain
    segments (no ``.``/``..``, query, fragment, percent-escapes or control characters)."""
    parts = resource_id.split("/")
    if (
        len(resource_id) > 1024
        or parts[0] != ""
        or len(parts) < 3
        or parts[1].lower() != "subscriptions"
        or any(p in ("", ".", "..") or not _ID_SEGMENT.fullmatch(p) for p in parts[1:])
    ):
        raise ArmError(
            f"refusing an ARM id that is not a plain resource path: {resource_id!r:.200}"
        )
    return resource_id


def _reference(body: dict[str, Any], key: str) -> str:
    ref = body.get("properties", {}).get(key)
    value = ref.get("id") if isinstance(ref, dict) else None
    return value.lower() if isinstance(value, str) else ""


def _error(response: requests.Response) -> dict[str, Any]:
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        return {}
    return error if isinstance(error, dict) else {}


def _error_code(response: requests.Response) -> str:
    return str(_error(response).get("code", ""))


def _error_message(response: requests.Response) -> str:
    return str(_error(response).get("message", ""))


def _refused(response: requests.Response, what: str, action: str, scope: str) -> Exception:
    """The exception for an answer that is neither success nor 404."""
    if response.status_code == 403:
        try:
            error = response.json().get("error") or {}
            code, message = str(error.get("code", "")), str(error.get("message", ""))
        except (ValueError, AttributeError):
            code, message = "", ""
        named = _AUTHORIZATION_FAILED.search(message)
        if named:
            action, scope = named.groups()
        detail = f"{code}: {message}" if code or message else "HTTP 403"
        return PermissionDenied(action, scope, detail[:500])
    if response.status_code == 401:
        return ArmError(
            f"{what}: HTTP 401, ARM refused the token (check the app's identity and that "
            "ARM_ENDPOINT is the token audience)"
        )
    return ArmError(f"{what}: HTTP {response.status_code}")


class ArmRestClient:
    def __init__(
        self,
        endpoint: str,
        credential: TokenCredential,
        *,
        session: requests.Session | None = None,
        policy: RetryPolicy = ARM_RETRY,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._endpoint = endpoint.rstrip("/")
        self._host = urlsplit(self._endpoint).netloc.lower()
        self._credential = credential
        # The token's audience is the ARM endpoint itself: https://management.azure.com in the
        # public cloud, another host in sovereign clouds (the Bicep sets ARM_ENDPOINT from
        # environment().resourceManager).
        self._scope = f"{self._endpoint}/.default"
        self._session = session or Session()
        self._policy = policy
        self._sleep = sleep

    def _headers(self) -> dict[str, str]:
        token = self._credential.get_token(self._scope).token
        return {"Authorization": f"Bearer {token}"}

    def _call(
        self,
        method: str,
        path_or_url: str,
        *,
        what: str,
        api_version: str | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        url = path_or_url if "://" in path_or_url else self._endpoint + path_or_url
        if urlsplit(url).netloc.lower() != self._host:
            # Never hand the bearer token to a host other than ARM's.
            raise ArmError(f"{what}: refusing to follow a URL outside {self._host}")
        # One span per ARM call (retries included), in the trace of the event being handled.
        with tracing.client_span(
            f"ARM {what}", **{"http.request.method": method, "server.address": self._host}
        ) as span:
            headers = {**self._headers(), **kwargs.pop("headers", {})}
            params = {"api-version": api_version} if api_version else None
            response = send(
                self._session,
                method,
                url,
                policy=self._policy,
                what=f"ARM {what}",
                sleep=self._sleep,
                headers=headers,
                params=params,
                **kwargs,
            )
            span.set_attribute("http.response.status_code", response.status_code)
            return response

    def _get_json(
        self, path: str, api_version: str, what: str, action: str
    ) -> dict[str, Any] | None:
        response = self._call("GET", path, what=what, api_version=api_version)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise _refused(response, what, action, path)
        body: dict[str, Any] = response.json()
        return body

    @staticmethod
    def _nic_ids(vm: dict[str, Any]) -> list[str]:
        nics = vm.get("properties", {}).get("networkProfile", {}).get("networkInterfaces", [])
        return [n["id"] for n in nics if isinstance(n, dict) and isinstance(n.get("id"), str)]

    @classmethod
    def _record(cls, vm: dict[str, Any], resource_id: str, **extra: Any) -> VmRecord:
        vm_id = vm.get("properties", {}).get("vmId")
        return VmRecord(
            id=str(vm.get("id") or resource_id),
            name=str(vm.get("name") or ""),
            vm_id=vm_id if isinstance(vm_id, str) else "",
            nic_ids=tuple(cls._nic_ids(vm)),
            **extra,
        )

    @staticmethod
    def _compute(subscription: str, group: str, *types_and_names: str) -> tuple[str, str]:
        """(the ARM id, the URL path) of a Microsoft.Compute resource: the id spelled as ARM
        spells it (plain names), the path with every name percent-encoded, nothing kept safe.
        ARM decodes the path, so both name the same resource; only the id is ever compared
        (a resource group ``rg(web)`` is ``rg%28web%29`` in the path and ``rg(web)`` in ids)."""
        head = ["subscriptions", subscription, "resourceGroups", group]
        head += ["providers", "Microsoft.Compute", *types_and_names]
        plain = "/" + "/".join(head)
        quoted = "/" + "/".join(
            part if index % 2 == 0 else names.segment(part) for index, part in enumerate(head)
        )
        return plain, quoted

    def get_vm(self, subscription: str, group: str, vm_name: str) -> VmRecord | None:
        resource_id, path = self._compute(
            names.subscription_id(subscription),
            names.resource_group(group),
            "virtualMachines",
            names.compute_name(vm_name),
        )
        vm = self._get_json(path, COMPUTE_API, "get VM", READ_VM)
        if vm is None:
            return None
        return self._record(
            vm,
            resource_id,
            availability_set=_reference(vm, "availabilitySet"),
            scale_set=_reference(vm, "virtualMachineScaleSet"),
        )

    def get_scale_set_vm(
        self, subscription: str, group: str, scale_set: str, instance_id: str
    ) -> VmRecord | None:
        subscription = names.subscription_id(subscription)
        group = names.resource_group(group)
        scale_set = names.SCALE_SET.check(scale_set, "scaleSet")
        scale_set_id, _ = self._compute(subscription, group, "virtualMachineScaleSets", scale_set)
        resource_id, path = self._compute(
            subscription,
            group,
            "virtualMachineScaleSets",
            scale_set,
            "virtualMachines",
            names.instance_id(instance_id),
        )
        vm = self._get_json(path, COMPUTE_API, "get scale-set VM", READ_SCALE_SET_VM)
        if vm is None:
            return None
        # The scale set's id from the plain names (never the quoted path): the scope check
        # compares it with the id Event Grid or the observer's record names.
        return self._record(vm, resource_id, scale_set=scale_set_id.lower(), uniform=True)

    def get_nic(self, nic_id: str) -> ArmDocument | None:
        response = self._call("GET", checked_id(nic_id), what="get NIC", api_version=NETWORK_API)
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            scale_set = "/virtualmachinescalesets/" in nic_id.lower()
            raise _refused(
                response, "get NIC", READ_SCALE_SET_VM_NIC if scale_set else READ_NIC, nic_id
            )
        body: dict[str, Any] = response.json()
        return ArmDocument(body=body, etag=body.get("etag") or response.headers.get("ETag"))

    def put_nic(self, nic_id: str, body: dict[str, Any], etag: str | None) -> None:
        headers = {"If-Match": etag} if etag else {}
        response = self._call(
            "PUT",
            checked_id(nic_id),
            what="put NIC",
            api_version=NETWORK_API,
            json=body,
            headers=headers,
            before_attempt=write_window.before_attempt,
        )
        if response.status_code == 412:
            raise PreconditionFailed(nic_id)
        if response.status_code == 400 and _error_code(response) == "InvalidResourceReference":
            # "Resource .../backendAddressPools/x referenced by resource .../networkInterfaces/
            # y was not found." (a pool, or its load balancer, deleted meanwhile)
            raise ReferenceMissing(f"put NIC {nic_id}: {_error_message(response)[:300]}")
        if response.status_code in LASTING_4XX:
            raise WriteRefused(
                response.status_code,
                _error_code(response)[:100],
                _error_message(response)[:300],
                what="put NIC",
            )
        if response.status_code not in (200, 201, 202):
            raise _refused(response, "put NIC", WRITE_NIC, nic_id)
        self._wait(response, "put NIC")

    def get_load_balancer(self, lb_id: str) -> ArmDocument | None:
        body = self._get_json(checked_id(lb_id), NETWORK_API, "get load balancer", READ_LB)
        return None if body is None else ArmDocument(body=body, etag=body.get("etag"))

    def rule_health(self, rule_id: str) -> dict[str, str]:
        """``POST {rule}/health`` (LoadBalancerLoadBalancingRules_Health, api-version
        2024-05-01): 200 with ``LoadBalancerHealthPerRule``, or 202 and a ``Location`` to poll
        until it answers 200 with that body (final-state-via location)."""
        path = f"{checked_id(rule_id)}/health"
        response = self._call("POST", path, what="rule health", api_version=NETWORK_API)
        if response.status_code == 202:
            response = self._final(response, "rule health")
        if response.status_code != 200:
            raise _refused(response, "rule health", RULE_HEALTH, rule_id)
        try:
            addresses = response.json().get("loadBalancerBackendAddresses") or []
        except (ValueError, AttributeError) as exc:
            raise ArmError(f"rule health: unreadable answer ({exc})") from exc
        states: dict[str, str] = {}
        for address in addresses if isinstance(addresses, list) else []:
            if not isinstance(address, dict):
                continue
            ipc, state = address.get("networkInterfaceIPConfigurationId"), address.get("state")
            if isinstance(ipc, str) and isinstance(state, str):
                states[ipc.lower()] = state
        return states

    def acknowledge_event(self, vm_resource_id: str, event_id: str) -> None:
        try:
            event = canonical_event_id(event_id)
        except CommandError as exc:
            raise ArmError(f"acknowledge: {exc}") from exc
        path = (
            f"{checked_id(vm_resource_id).rstrip('/')}/providers/Microsoft.Maintenance/"
            f"scheduledevents/{names.segment(event)}/acknowledge"
        )
        response = self._call(
            "POST",
            path,
            what="acknowledge",
            api_version=MAINTENANCE_API,
            before_attempt=write_window.before_attempt,
        )
        status = response.status_code
        if status in (200, 202, 204):
            return
        if status == 403:
            raise _refused(response, "acknowledge", ACKNOWLEDGE, vm_resource_id)
        if 400 <= status < 500 and status not in (401, 408, 429):
            try:
                code = str((response.json().get("error") or {}).get("code", ""))[:100]
            except (ValueError, AttributeError):
                code = ""
            raise AcknowledgeRefused(f"acknowledge: HTTP {status} {code}".rstrip())
        raise ArmError(f"acknowledge: HTTP {status}")

    def _final(self, response: requests.Response, what: str) -> requests.Response:
        """Poll a 202's Location until it stops answering 202 (bounded); its last answer."""
        location = response.headers.get("Location")
        if not location:
            raise ArmError(f"{what}: 202 without a Location")
        started = time.monotonic()
        for _ in range(MAX_POLLS):
            hint = retry_after(response)
            self._sleep(min(1.0 if hint is None else hint, 10.0))
            response = self._call("GET", location, what=f"{what} (location)")
            if response.status_code != 202:
                return response
            if time.monotonic() - started > MAX_POLL_SECONDS:
                break
        raise TransientHttpError(f"{what}: operation still running after polling")

    def _wait(self, response: requests.Response, what: str) -> None:
        """Follow a long-running operation to its end (bounded in polls and time)."""
        if response.status_code == 200:
            return
        operation = response.headers.get("Azure-AsyncOperation")
        location = response.headers.get("Location")
        if not operation and not location:
            return  # 201 without an operation: created synchronously
        started = time.monotonic()
        for _ in range(MAX_POLLS):
            hint = retry_after(response)
            self._sleep(min(1.0 if hint is None else hint, 10.0))
            if operation:
                response = self._call("GET", operation, what=f"{what} (operation)")
                if response.status_code != 200:
                    raise ArmError(f"{what}: operation status HTTP {response.status_code}")
                status = str(response.json().get("status", "")).lower()
                if status == "succeeded":
                    return
                if status in TERMINAL:
                    raise ArmError(f"{what}: operation {status}")
            else:
                assert location is not None
                response = self._call("GET", location, what=f"{what} (location)")
                if response.status_code in (200, 201, 204):
                    return
                if response.status_code != 202:
                    raise ArmError(f"{what}: operation location HTTP {response.status_code}")
            if time.monotonic() - started > MAX_POLL_SECONDS:
                break
        raise TransientHttpError(f"{what}: operation still running after polling")
