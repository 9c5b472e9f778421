"""Which way an approval goes: to the VM's forwarder, or through ARM (agentless VMs) (core).

The forwarder approves through IMDS, the fast path: the gate sends it an approve command on
the ``approvals`` queue. A VM without a forwarder cannot take a command; its events are
acknowledged through the ARM acknowledge API instead
(``{resource id}/providers/Microsoft.Maintenance/scheduledevents/{EventId}/acknowledge``),
which works for VMs, scale sets and availability sets alike. The route, in this order:

1. The message names no ARM id to acknowledge on: the command (nothing else can work).
2. The VM (or its scale set) is agentless by settings: ``AGENTLESS_RESOURCE_GROUPS`` holds its
   resource group or ``AGENTLESS_VM_PATTERNS`` matches its name or its scale set's name
   (shell-style patterns, case-insensitive): ARM.
3. The event came through Event Grid and names a scale set or an availability set, not a VM:
   there is no forwarder to address a command to: ARM.
4. With the heartbeat store (``ACKNOWLEDGE_FALLBACK_ENABLED``):
   - the event came through Event Grid and no Heartbeat of the VM is on record: no forwarder
     runs there: ARM;
   - the VM's last Heartbeat is older than ``HEARTBEAT_STALE_SECONDS``: its forwarder is silent:
     ARM (the fallback as before);
   - no record, but a forwarder reported the event: it is alive (it just sent it): the command.
5. Otherwise the command.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from fnmatch import fnmatchcase

from functions.shared.ports import HeartbeatStore
from sebridge.contract.events import Observer, TransitionMessage


class Route(StrEnum):
    COMMAND = "command"  # approvals queue -> the forwarder -> IMDS
    ACKNOWLEDGE = "acknowledge"  # ARM acknowledge API


@dataclass(frozen=True)
class RouteChoice:
    route: Route
    reason: str
    alarming: bool = False  # a forwarder that should be there is silent: worth a warning


@dataclass(frozen=True)
class AgentlessRules:
    """Which VMs are expected to run without a forwarder (AGENTLESS_* settings)."""

    resource_groups: frozenset[str] = frozenset()  # lower case
    vm_patterns: tuple[str, ...] = ()  # lower case

    @classmethod
    def of(cls, resource_groups: Iterable[str], vm_patterns: Iterable[str]) -> AgentlessRules:
        return cls(
            frozenset(g.strip().lower() for g in resource_groups if g.strip()),
            tuple(p.strip().lower() for p in vm_patterns if p.strip()),
        )

    def expects_forwarder(self, observer: Observer) -> bool:
        if observer.resource_group.lower() in self.resource_groups:
            return False
        names = [n.lower() for n in (observer.vm_name, observer.vm_scale_set_name) if n]
        return not any(fnmatchcase(n, p) for n in names for p in self.vm_patterns)


def through_event_grid(message: TransitionMessage) -> bool:
    return isinstance(message.data.get("eventGrid"), dict)


def names_a_vm(observer: Observer) -> bool:
    """A VM's id: a standalone or Flexible VM (``.../virtualMachines/web-1``) or a Uniform
    scale-set instance (``.../virtualMachineScaleSets/web/virtualMachines/0``)."""
    parts = observer.resource_id.lower().rstrip("/").split("/")
    return len(parts) >= 2 and parts[-2] == "virtualmachines"


def choose_route(
    message: TransitionMessage,
    now: datetime,
    *,
    rules: AgentlessRules | None,
    heartbeats: HeartbeatStore | None,
    stale_after: timedelta | None,
) -> RouteChoice:
    """The route for approving ``message``'s event, and why (for the log)."""
    observer = message.observer
    if not observer.resource_id:
        return RouteChoice(Route.COMMAND, "the message names no ARM id to acknowledge on")
    if rules is not None and not rules.expects_forwarder(observer):
        return RouteChoice(
            Route.ACKNOWLEDGE, "agentless by settings (AGENTLESS_RESOURCE_GROUPS/_VM_PATTERNS)"
        )
    from_event_grid = through_event_grid(message)
    if not names_a_vm(observer):
        # Only Event Grid names a scale set or availability set as the observer (a forwarder
        # is always a VM): there is no VM to send a command to.
        return RouteChoice(
            Route.ACKNOWLEDGE, "a scale set's or availability set's event from Event Grid"
        )
    if heartbeats is not None:
        last = heartbeats.last(observer.vm_name)
        if last is None and from_event_grid:
            return RouteChoice(Route.ACKNOWLEDGE, "no forwarder on record (no Heartbeat)")
        if last is not None and stale_after is not None and now - last > stale_after:
            return RouteChoice(
                Route.ACKNOWLEDGE, f"forwarder silent since {last.isoformat()}", alarming=True
            )
    return RouteChoice(Route.COMMAND, "the VM's forwarder approves through IMDS")
