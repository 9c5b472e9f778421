"""Which events take a VM out of service long enough to drain it from load balancers (pure).

lb-pools acts on exactly these events and the approval gate treats every other event as
"nothing to prepare", so the two can never disagree about what "prepared" means. The forwarder's
drain probe (``--drain-probe-port``) reads the same rules on the VM, which is why they live in
the kernel; ``functions.shared.impact`` re-exports them for the Function App.
"""

from __future__ import annotations

from dataclasses import dataclass

from sebridge.imds import ScheduledEvent

FREEZE = "Freeze"
KNOWN_EVENT_TYPES = ("Freeze", "Reboot", "Redeploy", "Preempt", "Terminate")
DEFAULT_IMPACTFUL = "Reboot,Redeploy,Preempt,Terminate"  # LB_IMPACTFUL_EVENT_TYPES when not set
DEFAULT_FREEZE_THRESHOLD = 9  # seconds: LB_FREEZE_THRESHOLD_SECONDS when it is not set
# The VM is gone afterwards: there is nothing to put back into a pool.
GONE_AFTERWARDS = frozenset({"terminate", "preempt"})


@dataclass(frozen=True)
class ImpactRules:
    impactful_event_types: frozenset[str]  # as configured (LB_IMPACTFUL_EVENT_TYPES)
    freeze_threshold_seconds: int  # LB_FREEZE_THRESHOLD_SECONDS

    def _listed(self, event_type: str) -> bool:
        return event_type.lower() in {t.lower() for t in self.impactful_event_types}

    def is_impactful(self, event: ScheduledEvent) -> bool:
        kind = event.event_type.lower()
        if self._listed(kind):
            return True
        if kind == FREEZE.lower():
            duration = event.duration_in_seconds
            # An unknown duration (-1 or missing) may be long: drain rather than guess short.
            return duration is None or duration < 0 or duration >= self.freeze_threshold_seconds
        return False

    def longest_undrained_freeze(self) -> int | None:
        """The longest Freeze (whole seconds) left in its pools; None when every Freeze drains
        (Freeze listed as impactful, or a threshold of 0)."""
        if self._listed(FREEZE) or self.freeze_threshold_seconds <= 0:
            return None
        return self.freeze_threshold_seconds - 1


DEFAULT_RULES = ImpactRules(frozenset(DEFAULT_IMPACTFUL.split(",")), DEFAULT_FREEZE_THRESHOLD)


def restores_afterwards(event: ScheduledEvent) -> bool:
    return event.event_type.lower() not in GONE_AFTERWARDS
