"""VM reads from ARM, remembered for a while (the scope check reads the same VMs again and again).

Every message is checked against ARM (is the observer who it claims to be; are the affected VMs
in its availability set or scale set), so the VM documents of a fleet are read over and over.
What the check uses changes rarely or never (a VM's vmId, its availability set and scale set;
its NICs), so VM reads are cached per process: found VMs for ``ttl`` seconds, not-found ones for
``negative_ttl`` (a VM created a moment ago is not refused for long), at most ``max_entries``
(least recently used first out). Everything else (NICs, load balancers, rule health, writes) is
passed through: those are capacity decisions and must be current. A 403 is never cached.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from functions.shared.ports import ArmClient, ArmDocument, VmRecord

DEFAULT_TTL = 300.0
DEFAULT_NEGATIVE_TTL = 30.0
DEFAULT_MAX_ENTRIES = 4096

_Key = tuple[str, ...]


class CachedVmReads:
    def __init__(
        self,
        inner: ArmClient,
        *,
        ttl: float = DEFAULT_TTL,
        negative_ttl: float = DEFAULT_NEGATIVE_TTL,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._inner = inner
        self._ttl, self._negative_ttl = ttl, negative_ttl
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, tuple[float, VmRecord | None]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def _cached(self, key: _Key, read: Callable[[], VmRecord | None]) -> VmRecord | None:
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] > now:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
            self.misses += 1
        record = read()  # outside the lock: a slow read must not stall every other thread
        expires = now + (self._ttl if record is not None else self._negative_ttl)
        with self._lock:
            self._entries[key] = (expires, record)
            self._entries.move_to_end(key)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return record

    def get_vm(self, subscription: str, group: str, vm_name: str) -> VmRecord | None:
        key = ("vm", subscription.lower(), group.lower(), vm_name.lower())
        return self._cached(key, lambda: self._inner.get_vm(subscription, group, vm_name))

    def get_scale_set_vm(
        self, subscription: str, group: str, scale_set: str, instance_id: str
    ) -> VmRecord | None:
        key = ("ssvm", subscription.lower(), group.lower(), scale_set.lower(), instance_id)
        return self._cached(
            key,
            lambda: self._inner.get_scale_set_vm(subscription, group, scale_set, instance_id),
        )

    def forget(self) -> None:
        with self._lock:
            self._entries.clear()

    # ---- passed through ----------------------------------------------------------------
    def get_nic(self, nic_id: str) -> ArmDocument | None:
        return self._inner.get_nic(nic_id)

    def put_nic(self, nic_id: str, body: dict[str, Any], etag: str | None) -> None:
        self._inner.put_nic(nic_id, body, etag)

    def get_load_balancer(self, lb_id: str) -> ArmDocument | None:
        return self._inner.get_load_balancer(lb_id)

    def rule_health(self, rule_id: str) -> dict[str, str]:
        return self._inner.rule_health(rule_id)

    def acknowledge_event(self, vm_resource_id: str, event_id: str) -> None:
        self._inner.acknowledge_event(vm_resource_id, event_id)
